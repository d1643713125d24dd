package main

import (
	"strings"
	"testing"
)

// open opens tokens or fails the test.
func open(t *testing.T, budgets *Budgets, tokens ...string) {
	t.Helper()
	if err := budgets.Open(tokens); err != nil {
		t.Fatalf("open %v: %s", tokens, err)
	}
}

func TestExecutionBudgetRefusesTheCallAfterTheLast(t *testing.T) {
	budgets := NewBudgets("u", 64, nil)
	open(t, budgets, "e1", "e2")
	for i := 0; i < 64; i++ {
		if exhausted := budgets.Acquire("e1"); exhausted != nil {
			t.Fatalf("call %d refused: %s", i+1, exhausted.Message)
		}
	}
	exhausted := budgets.Acquire("e1")
	if exhausted == nil || exhausted.Scope != "execution" ||
		exhausted.Message != "model call budget of 64 exhausted for this execution" {
		t.Fatalf("65th call: %+v", exhausted)
	}
	if budgets.Acquire("e2") != nil {
		t.Fatal("another execution was refused")
	}
}

func TestUnknownTokensAreRefusedAndChargeNobody(t *testing.T) {
	planned := 1
	budgets := NewBudgets("u", 2, &planned)
	open(t, budgets, "honest")
	for i := 0; i < 10; i++ {
		exhausted := budgets.Acquire("forged-" + strings.Repeat("x", i))
		if exhausted == nil || exhausted.Scope != "unknown_execution" {
			t.Fatalf("forged call %d: %+v", i+1, exhausted)
		}
	}
	if budgets.Acquire("honest") != nil || budgets.Acquire("honest") != nil {
		t.Fatal("the honest execution lost budget to forged calls")
	}
	if got := budgets.Snapshot(); got.Used != 2 {
		t.Fatalf("forged calls were counted: %+v", got)
	}
	exhausted := budgets.Acquire("honest")
	if exhausted == nil || exhausted.Scope != "execution" {
		t.Fatalf("third call of a 2-call execution: %+v", exhausted)
	}
	refused := budgets.Snapshot().Refused
	if refused["unknown_execution"] != 10 || refused["execution"] != 1 || len(refused) != 2 {
		t.Fatalf("refusals by scope: %+v", refused)
	}
	budgets.Configure("u2", 2, &planned)
	if got := budgets.Snapshot().Refused; len(got) != 0 {
		t.Fatalf("a new unit starts with no refusals: %+v", got)
	}
}

func TestClosedTokensCannotBeReused(t *testing.T) {
	budgets := NewBudgets("u", 5, nil)
	open(t, budgets, "t1")
	if budgets.Acquire("t1") != nil {
		t.Fatal("open token refused")
	}
	budgets.Close([]string{"t1"})
	if exhausted := budgets.Acquire("t1"); exhausted == nil || exhausted.Scope != "unknown_execution" {
		t.Fatalf("closed token accepted: %+v", exhausted)
	}
	if budgets.Open([]string{"t2", "t2"}) == nil {
		t.Fatal("a token was opened twice in one call")
	}
	open(t, budgets, "t3")
	if budgets.Open([]string{"t3"}) == nil {
		t.Fatal("an open token was opened again")
	}
}

func TestUnitTotalStopsSpreadingCallsOverTokens(t *testing.T) {
	planned := 3
	budgets := NewBudgets("u", 2, &planned)
	tokens := []string{"a", "b", "c", "d", "e", "f", "g"}
	open(t, budgets, tokens...)
	for i := 0; i < 6; i++ {
		if budgets.Acquire(tokens[i]) != nil {
			t.Fatalf("call %d refused before the unit total", i+1)
		}
	}
	exhausted := budgets.Acquire("g")
	if exhausted == nil || exhausted.Scope != "unit" ||
		exhausted.Message != "model call budget of 6 exhausted for this work unit (2 calls x 3 executions)" {
		t.Fatalf("7th call: %+v", exhausted)
	}
	snapshot := budgets.Snapshot()
	if snapshot.Used != 6 || *snapshot.Total != 6 || snapshot.OpenExecutions != 7 {
		t.Fatalf("snapshot %+v", snapshot)
	}
}

func TestConfigureStartsFreshCountersAndClosesTokens(t *testing.T) {
	budgets := NewBudgets("u1", 1, nil)
	open(t, budgets, "e")
	budgets.Acquire("e")
	planned := 1
	budgets.Configure("u2", 1, &planned)
	if exhausted := budgets.Acquire("e"); exhausted == nil || exhausted.Scope != "unknown_execution" {
		t.Fatalf("a token survived configure: %+v", exhausted)
	}
	open(t, budgets, "e")
	if budgets.Acquire("e") != nil {
		t.Fatal("counters were not reset")
	}
	if got := budgets.Snapshot(); got.UnitID != "u2" || got.Used != 1 {
		t.Fatalf("snapshot %+v", got)
	}
}

func TestZeroBudgetRefusesEveryCall(t *testing.T) {
	budgets := NewBudgets("u", 0, nil)
	open(t, budgets, "e")
	if budgets.Acquire("e") == nil {
		t.Fatal("a zero budget allowed a call")
	}
}

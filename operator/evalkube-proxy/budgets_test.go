package main

import (
	"strings"
	"testing"
)

func TestExecutionBudgetRefusesTheCallAfterTheLast(t *testing.T) {
	budgets := NewBudgets("u", 64, nil)
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

func TestUnitTotalStopsForgedExecutionIDs(t *testing.T) {
	planned := 3
	budgets := NewBudgets("u", 2, &planned)
	for i := 0; i < 6; i++ {
		if budgets.Acquire("forged-"+strings.Repeat("x", i)) != nil {
			t.Fatalf("call %d refused before the unit total", i+1)
		}
	}
	exhausted := budgets.Acquire("forged-new")
	if exhausted == nil || exhausted.Scope != "unit" ||
		exhausted.Message != "model call budget of 6 exhausted for this work unit (2 calls x 3 executions)" {
		t.Fatalf("7th call: %+v", exhausted)
	}
	snapshot := budgets.Snapshot()
	if snapshot.Used != 6 || *snapshot.Total != 6 || snapshot.Executions != 6 {
		t.Fatalf("snapshot %+v", snapshot)
	}
}

func TestConfigureStartsFreshCounters(t *testing.T) {
	budgets := NewBudgets("u1", 1, nil)
	budgets.Acquire("e")
	planned := 1
	budgets.Configure("u2", 1, &planned)
	if budgets.Acquire("e") != nil {
		t.Fatal("counters were not reset")
	}
	if got := budgets.Snapshot(); got.UnitID != "u2" || got.Used != 1 {
		t.Fatalf("snapshot %+v", got)
	}
}

func TestZeroBudgetRefusesEveryCall(t *testing.T) {
	if NewBudgets("u", 0, nil).Acquire("e") == nil {
		t.Fatal("a zero budget allowed a call")
	}
}

package main

import (
	"fmt"
	"maps"
	"sync"
)

// openExecutionsMax bounds the execution tokens open at once (limits.OPEN_EXECUTIONS_MAX).
const openExecutionsMax = 50_000

// BudgetExhausted says which budget refused a call; Message is meant for the grader's author.
// Scope "unknown_execution" means the token is not open (forged, reused or finished).
type BudgetExhausted struct {
	Message string
	Scope   string // "execution", "unit" or "unknown_execution"
}

// Budgets holds max_model_calls per grader execution and the unit's total
// (max_model_calls x planned executions). Executions are random tokens the runner opens
// before the grader may use them and closes when it takes their usage: a call naming any
// other token is refused and charged to nobody. The unit total stays as a second wall.
type Budgets struct {
	mu                   sync.Mutex
	unitID               string
	maxCallsPerExecution int
	plannedExecutions    *int
	used                 int
	perExecution         map[string]int
	// refused counts refused calls by scope: the runner reports them with the unit, since
	// Prometheus never scrapes a work-unit Pod's proxy.
	refused map[string]int
}

// BudgetSnapshot is the served unit's budget and use, as the control API shows it.
type BudgetSnapshot struct {
	UnitID               string         `json:"unit_id"`
	MaxCallsPerExecution int            `json:"max_calls_per_execution"`
	PlannedExecutions    *int           `json:"planned_executions"`
	Total                *int           `json:"total"`
	Used                 int            `json:"used"`
	OpenExecutions       int            `json:"open_executions"`
	Refused              map[string]int `json:"refused"`
}

func NewBudgets(unitID string, maxCallsPerExecution int, planned *int) *Budgets {
	b := &Budgets{}
	b.Configure(unitID, maxCallsPerExecution, planned)
	return b
}

// Configure serves unitID from now on, with fresh counters. planned == nil: no unit total.
func (b *Budgets) Configure(unitID string, maxCallsPerExecution int, planned *int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unitID = unitID
	b.maxCallsPerExecution = maxCallsPerExecution
	if planned != nil {
		value := *planned
		planned = &value
	}
	b.plannedExecutions = planned
	b.used = 0
	b.perExecution = make(map[string]int)
	b.refused = make(map[string]int)
}

func (b *Budgets) total() *int {
	if b.plannedExecutions == nil {
		return nil
	}
	total := b.maxCallsPerExecution * *b.plannedExecutions
	return &total
}

// Open lets graders call with tokens until they are closed; a token is opened only once.
func (b *Budgets) Open(tokens []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.perExecution)+len(tokens) > openExecutionsMax {
		return fmt.Errorf("at most %d executions may be open at once; close some (usage:take) first", openExecutionsMax)
	}
	seen := make(map[string]struct{}, len(tokens))
	for _, token := range tokens {
		_, open := b.perExecution[token]
		_, twice := seen[token]
		if open || twice {
			return fmt.Errorf("an execution token may be opened only once")
		}
		seen[token] = struct{}{}
	}
	for _, token := range tokens {
		b.perExecution[token] = 0
	}
	return nil
}

// Close ends tokens: later calls naming them are refused. nil closes every open token.
func (b *Budgets) Close(tokens []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if tokens == nil {
		b.perExecution = make(map[string]int)
		return
	}
	for _, token := range tokens {
		delete(b.perExecution, token)
	}
}

// Acquire counts one call of the open token executionID, or says why it is refused.
func (b *Budgets) Acquire(executionID string) *BudgetExhausted {
	b.mu.Lock()
	defer b.mu.Unlock()
	used, open := b.perExecution[executionID]
	if !open {
		b.refused["unknown_execution"]++
		return &BudgetExhausted{
			Message: "this execution token is not open (forged, reused or already finished); " +
				"call models through ctx.responses_create / ctx.embeddings_create",
			Scope: "unknown_execution",
		}
	}
	if used >= b.maxCallsPerExecution {
		b.refused["execution"]++
		return &BudgetExhausted{
			Message: fmt.Sprintf("model call budget of %d exhausted for this execution", b.maxCallsPerExecution),
			Scope:   "execution",
		}
	}
	if total := b.total(); total != nil && b.used >= *total {
		b.refused["unit"]++
		return &BudgetExhausted{
			Message: fmt.Sprintf(
				"model call budget of %d exhausted for this work unit (%d calls x %d executions)",
				*total, b.maxCallsPerExecution, *b.plannedExecutions),
			Scope: "unit",
		}
	}
	b.perExecution[executionID] = used + 1
	b.used++
	return nil
}

// Charge counts a call that was charged before (replayed from the journal), without checks.
func (b *Budgets) Charge(executionID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if used, open := b.perExecution[executionID]; open {
		b.perExecution[executionID] = used + 1
	}
	b.used++
}

func (b *Budgets) Snapshot() BudgetSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetSnapshot{
		UnitID:               b.unitID,
		MaxCallsPerExecution: b.maxCallsPerExecution,
		PlannedExecutions:    b.plannedExecutions,
		Total:                b.total(),
		Used:                 b.used,
		OpenExecutions:       len(b.perExecution),
		Refused:              maps.Clone(b.refused),
	}
}

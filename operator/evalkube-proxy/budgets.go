package main

import (
	"fmt"
	"sync"
)

// BudgetExhausted says which budget refused a call; Message is meant for the grader's author.
type BudgetExhausted struct {
	Message string
	Scope   string // "execution" or "unit"
}

// Budgets holds max_model_calls per grader execution and the unit's total
// (max_model_calls x planned executions). The grader sets its execution id itself, so the id
// alone cannot be trusted: the unit total means forged or rotated ids gain nothing.
type Budgets struct {
	mu                   sync.Mutex
	unitID               string
	maxCallsPerExecution int
	plannedExecutions    *int
	used                 int
	perExecution         map[string]int
}

// BudgetSnapshot is the served unit's budget and use, as the control API shows it.
type BudgetSnapshot struct {
	UnitID               string `json:"unit_id"`
	MaxCallsPerExecution int    `json:"max_calls_per_execution"`
	PlannedExecutions    *int   `json:"planned_executions"`
	Total                *int   `json:"total"`
	Used                 int    `json:"used"`
	Executions           int    `json:"executions"`
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
}

func (b *Budgets) total() *int {
	if b.plannedExecutions == nil {
		return nil
	}
	total := b.maxCallsPerExecution * *b.plannedExecutions
	return &total
}

// Acquire counts one call of executionID, or says which budget is exhausted.
func (b *Budgets) Acquire(executionID string) *BudgetExhausted {
	b.mu.Lock()
	defer b.mu.Unlock()
	used := b.perExecution[executionID]
	if used >= b.maxCallsPerExecution {
		return &BudgetExhausted{
			Message: fmt.Sprintf("model call budget of %d exhausted for this execution", b.maxCallsPerExecution),
			Scope:   "execution",
		}
	}
	if total := b.total(); total != nil && b.used >= *total {
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

func (b *Budgets) Snapshot() BudgetSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetSnapshot{
		UnitID:               b.unitID,
		MaxCallsPerExecution: b.maxCallsPerExecution,
		PlannedExecutions:    b.plannedExecutions,
		Total:                b.total(),
		Used:                 b.used,
		Executions:           len(b.perExecution),
	}
}

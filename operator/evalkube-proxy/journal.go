package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// journalFile is the journal's name in the state directory (--state-dir).
const journalFile = "journal.jsonl"

// journalMaxBytes is where the journal stops growing (given up with a warning, the proxy
// serving on from memory): three quarters of the work Pod's 256 Mi emptyDir, which the
// kubelet would otherwise evict the whole Pod for passing. Only budgeted calls, the runner's
// calls and the unit's bookkeeping are written (about 300 bytes a call), so a unit's journal
// is bounded by its budget; refused calls, which cost nothing and which a grader can send
// without limit, are counted in memory only.
const journalMaxBytes = 192 << 20

// Journal is the proxy's append-only record of what it must not forget when its process is
// killed and the kubelet starts it again in the same Pod: the unit's budget, the execution
// tokens opened and closed, the usage recorded and taken, and every model request written
// upstream (a "sent" record once the request left, a "done" record when its call finished).
// One JSON object a line, each written with one write(2) and no fsync: a killed process
// loses nothing the kernel already holds, and the state directory (an emptyDir) does not
// outlive the Pod's node anyway.
//
// Replay (OpenJournal) rebuilds budgets, tokens and usage. A call that was sent but never
// finished was paid for (the provider may have answered) and its answer never used: its
// requests count as retries, of its execution (a grader's call) or of the next call with the
// same X-Evalkube-Call key (the runner's call, sent again), and its budget slot is given back.
type Journal struct {
	mu       sync.Mutex
	file     *os.File
	failed   bool
	size     int64
	maxBytes int64
	calls    atomic.Uint64
	// lost: requests of the runner's calls (by key) that a killed process sent and never
	// answered, until the call is sent again and claims them.
	lostMu sync.Mutex
	lost   map[string]int
}

type journalRecord struct {
	T        string           `json:"t"`
	Unit     string           `json:"unit,omitempty"`
	Max      int              `json:"max,omitempty"`
	Planned  int              `json:"planned,omitempty"`
	Tokens   []string         `json:"tokens,omitempty"`
	All      bool             `json:"all,omitempty"`
	Call     uint64           `json:"call,omitempty"`
	Exec     string           `json:"exec,omitempty"`
	Key      string           `json:"key,omitempty"`
	Purpose  string           `json:"purpose,omitempty"`
	MS       float64          `json:"ms,omitempty"`
	RID      string           `json:"rid,omitempty"`
	Usage    map[string]int64 `json:"usage,omitempty"`
	OK       bool             `json:"ok,omitempty"`
	Requests int              `json:"requests,omitempty"`
	Budgeted bool             `json:"budgeted,omitempty"`
}

// pendingCall is a call the journal saw sent and not finished (yet).
type pendingCall struct {
	exec string
	key  string
	sent int
}

// ReplayReport says what a replay restored.
type ReplayReport struct {
	Records int
	// Lost: requests sent by a killed process whose calls never finished (counted as retries).
	Lost int
	// Unattributed: those of them with neither an execution nor a call key (counted nowhere).
	Unattributed int
}

// OpenJournal replays dir's journal into budgets and usage (when there is one) and opens it
// for appending. A nil *Journal (no state directory) records nothing.
func OpenJournal(dir string, budgets *Budgets, usage *UsageLedger) (*Journal, ReplayReport, error) {
	var report ReplayReport
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, report, err
	}
	path := filepath.Join(dir, journalFile)
	j := &Journal{lost: make(map[string]int)}
	if existing, err := os.Open(path); err == nil {
		report, err = j.replay(existing, budgets, usage)
		existing.Close()
		if err != nil {
			return nil, report, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, report, err
	}
	file, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, report, err
	}
	j.file, j.maxBytes = file, journalMaxBytes
	if info, err := file.Stat(); err == nil && info.Size() > 0 {
		j.size = info.Size()
		// a line the killed process wrote in part is ended, so this life's first record
		// is a line of its own
		last := make([]byte, 1)
		if _, err := file.ReadAt(last, info.Size()-1); err == nil && last[0] != '\n' {
			j.appendLine([]byte("\n"))
		}
	}
	j.write(journalRecord{T: "start"})
	return j, report, nil
}

func (j *Journal) replay(reader io.Reader, budgets *Budgets, usage *UsageLedger) (ReplayReport, error) {
	var report ReplayReport
	pending := make(map[uint64]*pendingCall)
	// resolve ends the calls of a dead process: what they sent was paid and never used.
	resolve := func() {
		for _, call := range pending {
			if call.sent == 0 {
				continue
			}
			report.Lost += call.sent
			switch {
			case call.exec != "":
				usage.AddRetries(call.exec, call.sent)
			case call.key != "":
				j.lost[call.key] += call.sent
			default:
				report.Unattributed += call.sent
			}
		}
		clear(pending)
	}
	lines := bufio.NewReaderSize(reader, 1<<16)
	for {
		line, err := lines.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 && err == nil {
			var record journalRecord
			// a line that does not parse (cut short by a full disk) is skipped
			if json.Unmarshal(line, &record) == nil {
				report.Records++
				if record.Call > j.calls.Load() {
					j.calls.Store(record.Call)
				}
				j.apply(record, pending, resolve, budgets, usage)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return report, fmt.Errorf("reading the journal: %w", err)
		}
	}
	resolve()
	return report, nil
}

func (j *Journal) apply(record journalRecord, pending map[uint64]*pendingCall, resolve func(),
	budgets *Budgets, usage *UsageLedger) {
	switch record.T {
	case "start":
		resolve()
	case "unit":
		planned := record.Planned
		budgets.Configure(record.Unit, record.Max, &planned)
	case "open":
		_ = budgets.Open(record.Tokens)
	case "take":
		if record.All {
			budgets.Close(nil)
			usage.TakeAll()
		} else {
			budgets.Close(record.Tokens)
			usage.Take(record.Tokens)
		}
	case "sent":
		call := pending[record.Call]
		if call == nil {
			call = &pendingCall{exec: record.Exec, key: record.Key}
			pending[record.Call] = call
		}
		call.sent++
	case "done":
		delete(pending, record.Call)
		if record.Key != "" {
			delete(j.lost, record.Key) // claimed by this call (counted in its requests)
		}
		if record.Budgeted {
			budgets.Charge(record.Exec)
		}
		if record.Exec != "" {
			usage.RecordCounts(record.Exec, record.Purpose, record.MS, record.RID, record.Usage, record.OK, record.Requests)
		}
	}
}

// write appends one record; a journal that cannot be written is given up (logged once): the
// proxy goes on serving from memory.
func (j *Journal) write(record journalRecord) {
	if j == nil {
		return
	}
	line, err := json.Marshal(record)
	if err != nil {
		return
	}
	j.appendLine(append(line, '\n'))
}

func (j *Journal) appendLine(line []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed {
		return
	}
	var err error
	if j.size+int64(len(line)) > j.maxBytes {
		err = fmt.Errorf("it reached its limit of %d bytes", j.maxBytes)
	} else {
		var n int
		n, err = j.file.Write(line)
		j.size += int64(n)
	}
	if err != nil {
		j.failed = true
		log.Printf("WARNING the journal cannot be written (%v): a restart of this proxy will lose its budgets, tokens and usage", err)
	}
}

// Close closes the journal file.
func (j *Journal) Close() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	_ = j.file.Close()
}

// NextCall numbers a model call (0 without a journal).
func (j *Journal) NextCall() uint64 {
	if j == nil {
		return 0
	}
	return j.calls.Add(1)
}

// Claim returns (and forgets) the requests a killed process sent for the runner's call key.
func (j *Journal) Claim(key string) int {
	if j == nil || key == "" {
		return 0
	}
	j.lostMu.Lock()
	defer j.lostMu.Unlock()
	n := j.lost[key]
	delete(j.lost, key)
	return n
}

func (j *Journal) Unit(unitID string, maxCalls, planned int) {
	j.write(journalRecord{T: "unit", Unit: unitID, Max: maxCalls, Planned: planned})
}

func (j *Journal) Open(tokens []string) { j.write(journalRecord{T: "open", Tokens: tokens}) }

// Take records usage taken (and tokens closed); nil: everything.
func (j *Journal) Take(ids []string) {
	if ids == nil {
		j.write(journalRecord{T: "take", All: true})
		return
	}
	j.write(journalRecord{T: "take", Tokens: ids})
}

// Sent records that one request of call was written upstream: from now on it may be billed.
func (j *Journal) Sent(call uint64, executionID, key string) {
	j.write(journalRecord{T: "sent", Call: call, Exec: executionID, Key: key})
}

// Done records a finished call with what the usage ledger records of it.
func (j *Journal) Done(call uint64, record journalRecord) {
	record.T, record.Call = "done", call
	j.write(record)
}

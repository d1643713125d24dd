package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Config is everything the native proxy needs, resolved by `evalkube proxy` (Python) from the
// EvalRun: providers with their key sources, default models, budgets. It never holds a key:
// keys are read from the named files or environment variables at call time.
type Config struct {
	Listen            *string                   `json:"listen"`
	ControlListen     *string                   `json:"control_listen"`
	ControlTokenFile  *string                   `json:"control_token_file"`
	JudgeModel        *string                   `json:"judge_model"`
	EmbeddingModel    *string                   `json:"embedding_model"`
	MaxCalls          int                       `json:"max_calls"`
	PlannedExecutions *int                      `json:"planned_executions"`
	UnitID            string                    `json:"unit_id"`
	Retries           int                       `json:"retries"`
	BackoffBase       float64                   `json:"backoff_base"`
	BackoffMax        float64                   `json:"backoff_max"`
	MaxConnections    int                       `json:"max_connections"`
	LogLevel          string                    `json:"log_level"`
	Providers         map[string]ProviderConfig `json:"providers"`
	// EgressProxy is the egress gateway's URL (http://host:port); every upstream call goes
	// through it with the grant of EgressGrantFile (egress.go). nil: direct.
	EgressProxy     *string `json:"egress_proxy"`
	EgressGrantFile *string `json:"egress_grant_file"`
	// StateDir holds the journal (journal.go) a restarted proxy replays. nil: none.
	StateDir *string `json:"state_dir"`
}

// ProviderConfig is one OpenAI-compatible endpoint and where its key comes from.
type ProviderConfig struct {
	BaseURL    string            `json:"base_url"`
	APIKeyEnv  *string           `json:"api_key_env"`
	APIKeyFile *string           `json:"api_key_file"`
	Headers    map[string]string `json:"headers"`
	Timeout    float64           `json:"timeout"`
	// API is what the provider serves for Responses requests: "responses" (default) or
	// "chat_completions" (requests and answers translated, chat.go).
	API string `json:"api"`
}

func defaultConfig() Config {
	return Config{
		MaxCalls:       64,
		UnitID:         "default",
		Retries:        4,
		BackoffBase:    0.5,
		BackoffMax:     30,
		MaxConnections: 128,
		LogLevel:       "INFO",
	}
}

// loadConfig reads the JSON configuration from path ("-" for standard input). Unknown fields
// are refused so that a Python side newer than this binary fails loudly, not silently.
func loadConfig(path string) (Config, error) {
	var reader io.Reader
	if path == "-" {
		reader = os.Stdin
	} else {
		file, err := os.Open(path)
		if err != nil {
			return Config{}, err
		}
		defer file.Close()
		reader = file
	}
	raw, err := io.ReadAll(io.LimitReader(reader, 1<<20))
	if err != nil {
		return Config{}, fmt.Errorf("reading the configuration: %w", err)
	}
	return parseConfig(raw)
}

func parseConfig(raw []byte) (Config, error) {
	config := defaultConfig()
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&config); err != nil {
		return Config{}, fmt.Errorf("invalid configuration: %w", err)
	}
	if config.MaxCalls < 0 {
		return Config{}, fmt.Errorf("invalid configuration: max_calls must be >= 0")
	}
	if config.PlannedExecutions != nil && *config.PlannedExecutions < 0 {
		return Config{}, fmt.Errorf("invalid configuration: planned_executions must be >= 0")
	}
	if config.Retries < 0 || config.BackoffBase < 0 || config.BackoffMax < 0 {
		return Config{}, fmt.Errorf("invalid configuration: retries and backoff must be >= 0")
	}
	if config.MaxConnections <= 0 {
		config.MaxConnections = 128
	}
	for name, provider := range config.Providers {
		if name == "" || strings.Contains(name, ":") {
			return Config{}, fmt.Errorf("invalid configuration: provider name %q", name)
		}
		if !strings.HasPrefix(provider.BaseURL, "http://") && !strings.HasPrefix(provider.BaseURL, "https://") {
			return Config{}, fmt.Errorf(
				"invalid configuration: providers.%s.base_url must start with http:// or https://", name)
		}
		if provider.Timeout <= 0 {
			provider.Timeout = 60
		}
		switch provider.API {
		case "":
			provider.API = responsesAPI
		case responsesAPI, chatCompletionsAPI:
		default:
			return Config{}, fmt.Errorf(
				"invalid configuration: providers.%s.api must be responses or chat_completions (got %q)", name, provider.API)
		}
		config.Providers[name] = provider
	}
	if err := checkEgress(config); err != nil {
		return Config{}, err
	}
	if config.Listen == nil && config.ControlListen == nil {
		return Config{}, fmt.Errorf("invalid configuration: set listen, control_listen or both")
	}
	return config, nil
}

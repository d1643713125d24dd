package main

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// purposes of model calls, as in the Python proxy's metrics.
var purposes = []string{"candidate", "judge", "embedding"}

// latencyBuckets (seconds): loopback fakes answer in under a millisecond, real providers in
// seconds.
var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// Metrics are the proxy's series, named and labelled exactly as the Python proxy's
// (evalkube_proxy_*), on a registry of their own. Labels carry purposes, provider names and
// outcomes only: never request content, execution ids or credentials.
type Metrics struct {
	registry         *prometheus.Registry
	calls            *prometheus.CounterVec
	latency          *prometheus.HistogramVec
	tokens           *prometheus.CounterVec
	retries          *prometheus.CounterVec
	budgetRejections *prometheus.CounterVec
	handler          http.Handler
}

func NewMetrics() *Metrics {
	m := &Metrics{registry: prometheus.NewRegistry()}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_proxy_model_calls_total",
		Help: "Model calls through the proxy by purpose, provider and outcome (ok, error, budget_exhausted).",
	}, []string{"purpose", "provider", "outcome"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "evalkube_proxy_model_call_duration_seconds",
		Help:    "Wall time of forwarded model calls (upstream time including retries).",
		Buckets: latencyBuckets,
	}, []string{"purpose"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_proxy_tokens_total",
		Help: "Tokens reported by providers, by purpose and kind (input, output, total, prompt).",
	}, []string{"purpose", "kind"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_proxy_upstream_retries_total",
		Help: "Upstream retries by provider and reason (HTTP status, timeout, unreachable).",
	}, []string{"provider", "reason"})
	m.budgetRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_proxy_budget_rejections_total",
		Help: "Calls refused because a budget was exhausted, by scope (execution, unit).",
	}, []string{"scope"})
	m.registry.MustRegister(m.calls, m.latency, m.tokens, m.retries, m.budgetRejections)
	for _, purpose := range purposes {
		m.latency.WithLabelValues(purpose)
	}
	m.handler = promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
	return m
}

// Call counts one call; seconds < 0 means it never reached a provider (no latency observed).
func (m *Metrics) Call(purpose, provider, outcome string, seconds float64) {
	m.calls.WithLabelValues(purpose, provider, outcome).Inc()
	if seconds >= 0 {
		m.latency.WithLabelValues(purpose).Observe(seconds)
	}
}

func (m *Metrics) AddTokens(purpose string, tokens []tokenCount) {
	for _, token := range tokens {
		m.tokens.WithLabelValues(purpose, strings.TrimSuffix(token.name, "_tokens")).Add(float64(token.value))
	}
}

func (m *Metrics) Retry(provider, reason string) {
	m.retries.WithLabelValues(provider, reason).Inc()
}

func (m *Metrics) Rejected(scope string) {
	m.budgetRejections.WithLabelValues(scope).Inc()
}

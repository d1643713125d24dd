package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
)

// keyPatterns are shapes of API keys scrubbed from any provider text even when they are not
// the configured key (a provider echoing some other credential it saw).
var keyPatterns = regexp.MustCompile(`(?:sk|pk|rk|key)-[A-Za-z0-9_\-]{8,}|Bearer\s+[A-Za-z0-9._\-~+/]{8,}=*`)

const (
	redacted = "[redacted]"
	// errorMessageChars is how much of a provider's error message is passed on.
	errorMessageChars = 500
	// responseBodyBytes bounds what is read from a provider (an embeddings batch answer is
	// the largest legitimate one).
	responseBodyBytes = 256 << 20
)

// UpstreamError is a failed model call; Message is safe to show (never a credential).
// Kind: credentials, http, timeout, unreachable, invalid_response, configuration,
// no_credentials. Status is the provider's HTTP status when it answered, else 0. Requests
// counts the call's attempts that may have reached the provider (as Answer.Requests).
type UpstreamError struct {
	Message  string
	Status   int
	Provider string
	Kind     string
	Requests int
	// reached: this attempt may have reached the provider (its request was written).
	reached bool
}

func (e *UpstreamError) Error() string { return e.Message }

// Provider is an OpenAI-compatible endpoint. Its key file (a mounted Secret) wins over its
// environment variable and is re-read when it changes, so a rotated Secret is used by the
// next call.
type Provider struct {
	Name       string
	BaseURL    string
	APIKeyEnv  string
	APIKeyFile string
	headers    http.Header
	Timeout    time.Duration
	// API: responsesAPI or chatCompletionsAPI (Responses requests translated, chat.go).
	API string

	mu        sync.Mutex
	keyStamp  [3]int64
	keyCached bool
	key       string
}

func newProvider(name string, config ProviderConfig) *Provider {
	p := &Provider{
		Name:    name,
		BaseURL: strings.TrimRight(config.BaseURL, "/"),
		headers: http.Header{},
		Timeout: time.Duration(config.Timeout * float64(time.Second)),
		API:     config.API,
	}
	if config.APIKeyEnv != nil {
		p.APIKeyEnv = *config.APIKeyEnv
	}
	if config.APIKeyFile != nil {
		p.APIKeyFile = *config.APIKeyFile
	}
	for name, value := range config.Headers {
		switch strings.ToLower(name) {
		case "authorization", "content-type", "content-length", "host":
			continue
		}
		p.headers.Set(name, value)
	}
	p.headers.Set("Content-Type", "application/json")
	// No User-Agent: Go's default would otherwise be sent.
	p.headers["User-Agent"] = []string{""}
	return p
}

// KeySource says where the key comes from, for error messages (never the key itself).
func (p *Provider) KeySource() string {
	var sources []string
	if p.APIKeyFile != "" {
		sources = append(sources, "key file "+p.APIKeyFile)
	}
	if p.APIKeyEnv != "" {
		sources = append(sources, "environment variable "+p.APIKeyEnv)
	}
	return strings.Join(sources, " or ")
}

// APIKey is the current key: the key file's when it exists and is not empty, else the
// environment variable's.
func (p *Provider) APIKey() string {
	if p.APIKeyFile != "" {
		p.mu.Lock()
		key := p.fileKey()
		p.mu.Unlock()
		if key != "" {
			return key
		}
	}
	if p.APIKeyEnv != "" {
		return os.Getenv(p.APIKeyEnv)
	}
	return ""
}

func (p *Provider) fileKey() string {
	info, err := os.Stat(p.APIKeyFile)
	if err != nil {
		p.keyCached = false
		return ""
	}
	stamp := [3]int64{info.ModTime().UnixNano(), info.Size(), inode(info)}
	if !p.keyCached || stamp != p.keyStamp {
		raw, err := os.ReadFile(p.APIKeyFile)
		if err != nil {
			p.keyCached = false
			return ""
		}
		p.key, p.keyStamp, p.keyCached = strings.TrimSpace(string(raw)), stamp, true
	}
	return p.key
}

func inode(info os.FileInfo) int64 {
	if stat, ok := info.Sys().(*syscall.Stat_t); ok {
		return int64(stat.Ino)
	}
	return 0
}

// Upstream calls providers with retries (429, 5xx, timeouts, connection failures; exponential
// backoff honouring Retry-After) and turns every failure into a safe UpstreamError.
type Upstream struct {
	Providers   map[string]*Provider
	Retries     int
	BackoffBase float64
	BackoffMax  float64
	OnRetry     func(provider, reason string)
	client      *http.Client
}

func NewUpstream(config Config) *Upstream {
	providers := make(map[string]*Provider, len(config.Providers))
	for name, provider := range config.Providers {
		providers[name] = newProvider(name, provider)
	}
	transport := &http.Transport{
		Proxy:                 nil, // as the Python proxy: the environment's proxies are not used
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          config.MaxConnections,
		MaxIdleConnsPerHost:   config.MaxConnections,
		MaxConnsPerHost:       config.MaxConnections,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	if config.EgressProxy != nil {
		transport.Proxy = egressProxy(*config.EgressProxy, deref(config.EgressGrantFile))
		transport.OnProxyConnectResponse = egressConnectRefusal
	}
	return &Upstream{
		Providers:   providers,
		Retries:     config.Retries,
		BackoffBase: config.BackoffBase,
		BackoffMax:  config.BackoffMax,
		client: &http.Client{
			Transport:     transport,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// ProviderNames are the configured providers, sorted (for messages).
func (u *Upstream) ProviderNames() []string {
	names := make([]string, 0, len(u.Providers))
	for name := range u.Providers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Answer is what the proxy reads of a provider's answer: its id and token usage. Requests
// is how many of the call's attempts may have reached the provider, this answer's included:
// each may be billed (a timed-out or dropped attempt may have been answered, a 429 or 5xx
// was at least received), so Requests-1 is counted as the call's retries, never hidden.
type Answer struct {
	ID       json.RawMessage `json:"id"`
	Usage    Usage           `json:"usage"`
	Requests int             `json:"-"`
}

// ResponsesCall is the path and payload of a Responses request for the provider: as is, or
// translated to Chat Completions for an api "chat_completions" provider (an untranslatable
// request is a configuration error: nothing is sent).
func (u *Upstream) ResponsesCall(providerName string, payload []byte) (string, []byte, *UpstreamError) {
	provider, ok := u.Providers[providerName]
	if !ok || provider.API != chatCompletionsAPI {
		return Responses.path(), payload, nil
	}
	chat, err := chatPayload(payload)
	if err != nil {
		return "", nil, &UpstreamError{
			Message:  fmt.Sprintf("provider %s speaks Chat Completions (api: chat_completions): %s", providerName, err),
			Provider: providerName,
			Kind:     "configuration",
		}
	}
	return chatPath, chat, nil
}

// PostCall posts what ResponsesCall built (or any other model call); a chat completion comes
// back as the Responses object it stands for, with that object's id and usage.
func (u *Upstream) PostCall(providerName, path string, payload []byte) ([]byte, Answer, *UpstreamError) {
	return u.PostCallTraced(providerName, path, payload, nil)
}

// PostCallTraced is PostCall calling sent (when not nil) each time a request of the call has
// been written upstream: from then on the provider may bill it.
func (u *Upstream) PostCallTraced(providerName, path string, payload []byte, sent func()) ([]byte, Answer, *UpstreamError) {
	raw, answer, failure := u.post(providerName, path, payload, sent)
	if failure != nil || path != chatPath {
		return raw, answer, failure
	}
	invalid := func(message string) ([]byte, Answer, *UpstreamError) {
		return nil, Answer{}, &UpstreamError{
			Message:  fmt.Sprintf("provider %s answered %s", providerName, message),
			Status:   200,
			Provider: providerName,
			Kind:     "invalid_response",
			Requests: answer.Requests,
		}
	}
	chat, err := decodeObject(raw)
	if err != nil {
		return invalid("with invalid JSON")
	}
	translated, err := responsesAnswer(chat)
	if err != nil {
		return invalid(err.Error())
	}
	out, err := encodeJSON(translated)
	if err != nil {
		return invalid("with an answer that could not be re-encoded")
	}
	requests := answer.Requests
	answer = Answer{}
	if err := json.Unmarshal(out, &answer); err != nil {
		answer.Requests = requests
		return invalid("with an answer that could not be re-encoded")
	}
	answer.Requests = requests
	return out, answer, nil
}

// Post sends payload to provider's path and returns the raw answer (a JSON object, passed on
// unchanged) with its id and usage.
func (u *Upstream) Post(providerName, path string, payload []byte) ([]byte, Answer, *UpstreamError) {
	return u.post(providerName, path, payload, nil)
}

func (u *Upstream) post(providerName, path string, payload []byte, sent func()) ([]byte, Answer, *UpstreamError) {
	provider, ok := u.Providers[providerName]
	if !ok {
		known := strings.Join(u.ProviderNames(), ", ")
		if known == "" {
			known = "none"
		}
		return nil, Answer{}, &UpstreamError{
			Message:  fmt.Sprintf("provider '%s' is not configured (configured: %s)", providerName, known),
			Provider: providerName,
			Kind:     "configuration",
		}
	}
	target := provider.BaseURL + path
	requests := 0
	for attempt := 0; ; attempt++ {
		raw, retryAfter, failure := u.attempt(provider, target, payload, sent)
		if failure == nil {
			requests++
			var answer Answer
			if failure = decodeAnswer(raw, &answer, provider.Name); failure == nil {
				answer.Requests = requests
				return raw, answer, nil
			}
		} else if failure.reached {
			requests++
		}
		failure.Requests = requests
		if failure.Kind == "credentials" || failure.Kind == "no_credentials" || failure.Kind == "invalid_response" ||
			(failure.Kind == "http" && failure.Status != 429 && failure.Status < 500) {
			return nil, Answer{}, failure
		}
		if attempt >= u.Retries {
			if attempt > 0 {
				failure.Message = fmt.Sprintf("%s (after %d attempts)", failure.Message, attempt+1)
			}
			return nil, Answer{}, failure
		}
		if u.OnRetry != nil {
			reason := failure.Kind
			if failure.Status != 0 {
				reason = strconv.Itoa(failure.Status)
			}
			u.OnRetry(providerName, reason)
		}
		wait := retryAfter
		if wait < 0 {
			wait = math.Min(u.BackoffMax, u.BackoffBase*math.Pow(2, float64(attempt))) * (0.5 + rand.Float64()/2)
		}
		time.Sleep(time.Duration(math.Min(wait, u.BackoffMax) * float64(time.Second)))
	}
}

// attempt makes one call. retryAfter is the provider's Retry-After in seconds, or -1.
func (u *Upstream) attempt(provider *Provider, target string, payload []byte, sent func()) ([]byte, float64, *UpstreamError) {
	key := provider.APIKey()
	if key == "" && provider.KeySource() != "" {
		return nil, -1, &UpstreamError{
			Message:  fmt.Sprintf("no API key for provider %s: %s is missing or empty", provider.Name, provider.KeySource()),
			Provider: provider.Name,
			Kind:     "no_credentials",
		}
	}
	// The call finishes even when the grader hangs up: the provider is charged either way,
	// and the audit must say so.
	ctx, cancel := context.WithTimeout(context.Background(), provider.Timeout)
	defer cancel()
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(payload))
	if err != nil {
		return nil, -1, &UpstreamError{
			Message:  fmt.Sprintf("provider %s has an unusable base URL: %s", provider.Name, scrub(err.Error(), key)),
			Provider: provider.Name,
			Kind:     "configuration",
		}
	}
	request.Header = provider.headers.Clone()
	if key != "" {
		request.Header.Set("Authorization", "Bearer "+key)
	}
	// Once the request is written the provider may read, answer and bill it, whatever
	// happens to the connection afterwards; before (dialing, the egress tunnel) it cannot.
	var wrote atomic.Bool
	request = request.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { wrote.Store(true) },
		// the whole request written (body included): the journal's "sent" record
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil && sent != nil {
				sent()
			}
		},
	}))
	response, err := u.client.Do(request)
	var raw []byte
	if err == nil {
		raw, err = readAll(io.LimitReader(response.Body, responseBodyBytes), response.ContentLength, responseBodyBytes)
		response.Body.Close()
	}
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
			return nil, -1, &UpstreamError{
				Message:  fmt.Sprintf("provider %s timed out after %s s", provider.Name, formatSeconds(provider.Timeout)),
				Provider: provider.Name,
				Kind:     "timeout",
				reached:  wrote.Load(),
			}
		}
		return nil, -1, &UpstreamError{
			Message:  fmt.Sprintf("provider %s is unreachable at %s: %s", provider.Name, origin(provider.BaseURL), transportReason(err)),
			Provider: provider.Name,
			Kind:     "unreachable",
			reached:  wrote.Load(),
		}
	}
	status := response.StatusCode
	if refusal := egressRefusal(response); refusal != "" {
		return nil, -1, &UpstreamError{
			Message:  fmt.Sprintf("provider %s is unreachable at %s: connection failed (%s)", provider.Name, origin(provider.BaseURL), refusal),
			Provider: provider.Name,
			Kind:     "unreachable",
			// the gateway had sent it on when the provider failed: it may be billed
			reached: response.Header.Get(sentHeader) != "",
		}
	}
	if status < 400 {
		return raw, -1, nil
	}
	if status == 401 || status == 403 {
		source := provider.KeySource()
		if source == "" {
			source = "API key"
		}
		return nil, -1, &UpstreamError{
			Message:  fmt.Sprintf("credentials rejected by provider %s (HTTP %d); check its %s", provider.Name, status, source),
			Status:   status,
			Provider: provider.Name,
			Kind:     "credentials",
			reached:  true,
		}
	}
	reason := strings.TrimSpace(strings.TrimPrefix(response.Status, strconv.Itoa(status)))
	message := scrub(errorMessage(raw, reason), key)
	return nil, retryAfterSeconds(response.Header.Get("Retry-After"), time.Now()), &UpstreamError{
		Message:  fmt.Sprintf("provider %s answered HTTP %d: %s", provider.Name, status, message),
		Status:   status,
		Provider: provider.Name,
		Kind:     "http",
		reached:  true,
	}
}

// decodeAnswer reads id and usage of a provider's answer, refusing one that is not a JSON
// object (one scan of the document).
func decodeAnswer(raw []byte, answer *Answer, provider string) *UpstreamError {
	err := json.Unmarshal(raw, answer)
	if err == nil {
		if trimmed := bytes.TrimSpace(raw); trimmed[0] == '{' {
			return nil
		}
	}
	message := fmt.Sprintf("provider %s answered with a non-object", provider)
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) || (err != nil && len(bytes.TrimSpace(raw)) == 0) {
		message = fmt.Sprintf("provider %s answered with invalid JSON", provider)
	}
	return &UpstreamError{Message: message, Status: 200, Provider: provider, Kind: "invalid_response"}
}

// scrub removes secret and anything shaped like an API key from text.
func scrub(text, secret string) string {
	if len(secret) >= 4 {
		text = strings.ReplaceAll(text, secret, redacted)
	}
	return keyPatterns.ReplaceAllString(text, redacted)
}

// retryAfterSeconds parses Retry-After (seconds or an HTTP date); -1 when absent or unusable.
func retryAfterSeconds(value string, now time.Time) float64 {
	value = strings.TrimSpace(value)
	if value == "" {
		return -1
	}
	if seconds, err := strconv.ParseFloat(value, 64); err == nil && !math.IsNaN(seconds) && !math.IsInf(seconds, 0) {
		return math.Max(0, seconds)
	}
	when, err := http.ParseTime(value)
	if err != nil {
		return -1
	}
	return math.Max(0, when.Sub(now).Seconds())
}

// errorMessage is the provider's own error text: error.message, a string error, the body, or
// the HTTP reason, at most errorMessageChars characters.
func errorMessage(raw []byte, reason string) string {
	var document any
	if err := json.Unmarshal(raw, &document); err != nil {
		text := strings.TrimSpace(strings.ToValidUTF8(string(raw), "\uFFFD"))
		if text == "" {
			text = reason
		}
		if text == "" {
			text = "error"
		}
		return truncate(text, errorMessageChars)
	}
	if object, ok := document.(map[string]any); ok {
		switch failure := object["error"].(type) {
		case map[string]any:
			if message, ok := failure["message"].(string); ok {
				return truncate(message, errorMessageChars)
			}
		case string:
			return truncate(failure, errorMessageChars)
		}
		// vLLM: {"object": "error", "message": ...}
		if message, ok := object["message"].(string); ok {
			return truncate(message, errorMessageChars)
		}
	}
	if reason == "" {
		return "error"
	}
	return reason
}

func truncate(text string, chars int) string {
	if utf8.RuneCountInString(text) <= chars {
		return text
	}
	return string([]rune(text)[:chars])
}

// origin is scheme://host of a base URL, without credentials or path.
func origin(baseURL string) string {
	parsed, err := url.Parse(baseURL)
	if err != nil || parsed.Host == "" {
		return baseURL
	}
	return parsed.Scheme + "://" + parsed.Host
}

var errnoNames = map[syscall.Errno]string{
	syscall.ECONNREFUSED: "Connection refused",
	syscall.ECONNRESET:   "Connection reset by peer",
	syscall.EHOSTUNREACH: "No route to host",
	syscall.ENETUNREACH:  "Network is unreachable",
	syscall.ETIMEDOUT:    "Connection timed out",
}

func transportReason(err error) string {
	var egressErr *egressError
	if errors.As(err, &egressErr) {
		return "connection failed (" + egressErr.reason + ")"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name, ok := errnoNames[errno]; ok {
			return "connection failed (" + name + ")"
		}
		return "connection failed (" + errno.Error() + ")"
	}
	var dnsError *net.DNSError
	if errors.As(err, &dnsError) {
		return "connection failed (cannot resolve " + dnsError.Name + ")"
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "the server closed the connection"
	}
	var opError *net.OpError
	if errors.As(err, &opError) {
		return "connection failed (" + opError.Op + ")"
	}
	return "connection failed"
}

// formatSeconds prints a duration in seconds as Python's "%g" does (60 -> "60", 0.5 -> "0.5").
func formatSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'g', -1, 64)
}

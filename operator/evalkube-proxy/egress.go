package main

// The proxy sidecar's side of the egress gateway (gateway.go): with egress_proxy set, every
// upstream call goes through the gateway, carrying the run's grant (read from
// egress_grant_file, again whenever the mounted Secret changes) as the proxy URL's userinfo,
// which net/http sends as Proxy-Authorization: Basic base64("evalkube:" + grant) on CONNECT
// (https providers) and on absolute-form requests (http providers).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// egressError: the grant could not be read, or the gateway refused a CONNECT (the call fails
// as unreachable, with this reason).
type egressError struct{ reason string }

func (e *egressError) Error() string { return e.reason }

func checkEgress(config Config) error {
	if config.EgressProxy == nil {
		if config.EgressGrantFile != nil {
			return errors.New("invalid configuration: egress_grant_file needs egress_proxy")
		}
		return nil
	}
	gateway, err := url.Parse(*config.EgressProxy)
	if err != nil || gateway.Scheme != "http" || gateway.Host == "" || gateway.User != nil ||
		(gateway.Path != "" && gateway.Path != "/") {
		return fmt.Errorf("invalid configuration: egress_proxy must be http://host:port, not %q", *config.EgressProxy)
	}
	if config.EgressGrantFile == nil || *config.EgressGrantFile == "" {
		return errors.New("invalid configuration: egress_proxy needs egress_grant_file")
	}
	return nil
}

// egressProxy is the transport's Proxy function: the gateway with the current grant.
func egressProxy(gatewayURL, grantFile string) func(*http.Request) (*url.URL, error) {
	gateway, _ := url.Parse(gatewayURL)
	grant := &watchedFile{path: grantFile}
	return func(*http.Request) (*url.URL, error) {
		token, err := grant.Read()
		if err != nil || token == "" {
			if err == nil {
				err = errors.New("it is empty")
			}
			return nil, &egressError{fmt.Sprintf("egress grant %s unreadable: %v", grantFile, err)}
		}
		withGrant := *gateway
		withGrant.User = url.UserPassword(grantUser, token)
		return &withGrant, nil
	}
}

// egressConnectRefusal turns the gateway's answer to CONNECT, when it is not 200, into an
// egressError (net/http would keep only the reason phrase, untyped).
func egressConnectRefusal(_ context.Context, _ *url.URL, _ *http.Request, response *http.Response) error {
	if response.StatusCode == http.StatusOK {
		return nil
	}
	return &egressError{egressRefusal(response)}
}

// egressRefusal is the reason of the gateway's own refusal of a forwarded plain-HTTP call
// (marked by refusedHeader), or "" for a provider's answer.
func egressRefusal(response *http.Response) string {
	if response.Header.Get(refusedHeader) == "" && response.Request != nil && response.Request.Method != http.MethodConnect {
		return ""
	}
	return "egress gateway refused: " + strings.TrimSpace(strings.TrimPrefix(response.Status, fmt.Sprint(response.StatusCode)))
}

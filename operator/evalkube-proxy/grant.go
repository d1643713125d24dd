package main

// Egress grants: what lets a work-unit pod's proxy sidecar through the egress gateway.
//
// A grant is stateless and signed by the operator (evalkube.controller.egress_grants.mint_grant) with
// a key only the operator and the gateway hold:
//
//	"v1." + b64url(payload) + "." + b64url(HMAC-SHA256(key, "v1." + b64url(payload)))
//
// b64url is unpadded base64url (RFC 4648 §5); the MAC covers the version prefix and the
// encoded payload exactly as sent. The payload is a JSON object:
//
//	{"v": 1, "run": "ns/name", "uid": "...", "hosts": ["api.openai.com:443"], "exp": unix}
//
// hosts are lower-case host:port authorities with an explicit port. The shared vectors in
// tests/fixtures/egress_grants.json keep this file and the Python minter byte-compatible.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	grantPrefix = "v1."
	// grantChars bounds a grant before any decoding (a run with dozens of providers stays
	// far below it).
	grantChars = 8 << 10
	// minGrantKeyBytes is the shortest signing key accepted (HMAC-SHA256's block is 64).
	minGrantKeyBytes = 32
)

// Grant is a verified grant's payload.
type Grant struct {
	Version int      `json:"v"`
	Run     string   `json:"run"`
	UID     string   `json:"uid"`
	Hosts   []string `json:"hosts"`
	Expires int64    `json:"exp"`
}

// Allows reports whether authority (lower-case host:port, explicit port) is granted.
func (g Grant) Allows(authority string) bool {
	for _, host := range g.Hosts {
		if strings.ToLower(host) == authority {
			return true
		}
	}
	return false
}

// grantError is why a grant was refused (safe to log and to answer: it never holds the key).
type grantError struct{ reason string }

func (e *grantError) Error() string { return e.reason }

// signGrant returns the token of payload signed with key (the gateway never mints; tests and
// the shared vectors do).
func signGrant(key []byte, payload []byte) string {
	signed := grantPrefix + base64.RawURLEncoding.EncodeToString(payload)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verifyGrant checks token against every key (any may have signed it: rotation) and the
// payload's version and expiry at now.
func verifyGrant(keys [][]byte, token string, now time.Time) (Grant, error) {
	if token == "" {
		return Grant{}, &grantError{"no grant"}
	}
	if len(token) > grantChars {
		return Grant{}, &grantError{"grant too long"}
	}
	if !strings.HasPrefix(token, grantPrefix) {
		return Grant{}, &grantError{"not a v1 grant"}
	}
	dot := strings.LastIndexByte(token, '.')
	if dot < len(grantPrefix) {
		return Grant{}, &grantError{"garbled grant"}
	}
	signed, encodedMAC := token[:dot], token[dot+1:]
	got, err := base64.RawURLEncoding.DecodeString(encodedMAC)
	if err != nil || len(got) != sha256.Size {
		return Grant{}, &grantError{"garbled grant signature"}
	}
	valid := false
	for _, key := range keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(signed))
		if hmac.Equal(mac.Sum(nil), got) {
			valid = true
		}
	}
	if !valid {
		return Grant{}, &grantError{"grant signature does not verify"}
	}
	raw, err := base64.RawURLEncoding.DecodeString(signed[len(grantPrefix):])
	if err != nil {
		return Grant{}, &grantError{"garbled grant payload"}
	}
	var grant Grant
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&grant); err != nil {
		return Grant{}, &grantError{"garbled grant payload"}
	}
	if grant.Version != 1 {
		return Grant{}, &grantError{"unsupported grant version " + strconv.Itoa(grant.Version)}
	}
	if grant.Expires <= now.Unix() {
		return Grant{}, &grantError{fmt.Sprintf("grant of run %s expired at %d", grant.Run, grant.Expires)}
	}
	return grant, nil
}

// normalAuthority is host:port with the host lower-cased, or "" when host or port is not
// usable (empty host, a port that is not a plain decimal 1..65535).
func normalAuthority(host, port string) string {
	if host == "" || strings.ContainsAny(host, "/@ \t") {
		return ""
	}
	if number, err := strconv.Atoi(port); err != nil || number <= 0 || number > 65535 || strconv.Itoa(number) != port {
		return ""
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}

// watchedFile is a small file (a mounted Secret's key) read again whenever its modification
// time, size or inode changes, so a rotated Secret is used by the next request.
type watchedFile struct {
	path   string
	mu     sync.Mutex
	stamp  [3]int64
	cached bool
	value  string
}

func (f *watchedFile) Read() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, err := os.Stat(f.path)
	if err != nil {
		f.cached = false
		return "", err
	}
	stamp := [3]int64{info.ModTime().UnixNano(), info.Size(), inode(info)}
	if !f.cached || stamp != f.stamp {
		if info.Size() > 1<<20 {
			return "", errors.New(f.path + " is larger than 1 MiB")
		}
		raw, err := os.ReadFile(f.path)
		if err != nil {
			f.cached = false
			return "", err
		}
		f.value, f.stamp, f.cached = strings.TrimSpace(string(raw)), stamp, true
	}
	return f.value, nil
}

// grantKeys reads the signing keys from a key file: one key per line, the first one signs
// (the operator), any verifies (the gateway), so a key is rotated by prepending the new one
// and dropping the old one after the longest grant lifetime.
func grantKeys(file *watchedFile) ([][]byte, error) {
	text, err := file.Read()
	if err != nil {
		return nil, fmt.Errorf("grant key file: %w", err)
	}
	var keys [][]byte
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if len(line) < minGrantKeyBytes {
			return nil, fmt.Errorf("grant key file %s: a key is shorter than %d bytes", file.path, minGrantKeyBytes)
		}
		keys = append(keys, []byte(line))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("grant key file %s holds no key", file.path)
	}
	return keys, nil
}

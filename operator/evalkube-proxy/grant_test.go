package main

// Grants against the vectors shared with the Python minter (tests/fixtures/egress_grants.json):
// Go must sign each payload to the exact token Python minted, verify it, and refuse each
// refused vector.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

type grantVectors struct {
	Key      string `json:"key"`
	OtherKey string `json:"other_key"`
	Now      int64  `json:"now"`
	Grants   []struct {
		Name    string   `json:"name"`
		Run     string   `json:"run"`
		Payload string   `json:"payload"`
		Token   string   `json:"token"`
		Granted []string `json:"granted"`
		Exp     int64    `json:"exp"`
	} `json:"grants"`
	Refused []struct {
		Why   string `json:"why"`
		Token string `json:"token"`
	} `json:"refused"`
}

func loadVectors(t *testing.T) grantVectors {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "fixtures", "egress_grants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vectors grantVectors
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Grants) == 0 || len(vectors.Refused) == 0 {
		t.Fatal("no vectors")
	}
	return vectors
}

func TestGrantVectorsSignAndVerify(t *testing.T) {
	vectors := loadVectors(t)
	now := time.Unix(vectors.Now, 0)
	for _, vector := range vectors.Grants {
		if got := signGrant([]byte(vectors.Key), []byte(vector.Payload)); got != vector.Token {
			t.Errorf("%s: Go signs %s, Python minted %s", vector.Name, got, vector.Token)
		}
		grant, err := verifyGrant([][]byte{[]byte(vectors.Key)}, vector.Token, now)
		if err != nil {
			t.Errorf("%s: refused: %v", vector.Name, err)
			continue
		}
		if !slices.Equal(grant.Hosts, vector.Granted) || grant.Expires != vector.Exp {
			t.Errorf("%s: decoded %+v", vector.Name, grant)
		}
		// Rotation: a key ring whose first key is new still accepts the old key's grants.
		if _, err := verifyGrant([][]byte{[]byte(vectors.OtherKey), []byte(vectors.Key)}, vector.Token, now); err != nil {
			t.Errorf("%s: refused by a ring holding its key second: %v", vector.Name, err)
		}
		// And a ring without its key refuses them.
		if _, err := verifyGrant([][]byte{[]byte(vectors.OtherKey)}, vector.Token, now); err == nil {
			t.Errorf("%s: accepted without its key", vector.Name)
		}
		// Expiry is exclusive: at exp the grant is dead.
		if _, err := verifyGrant([][]byte{[]byte(vectors.Key)}, vector.Token, time.Unix(vector.Exp, 0)); err == nil {
			t.Errorf("%s: accepted at its expiry", vector.Name)
		}
	}
}

func TestGrantVectorsRefused(t *testing.T) {
	vectors := loadVectors(t)
	for _, vector := range vectors.Refused {
		if grant, err := verifyGrant([][]byte{[]byte(vectors.Key)}, vector.Token, time.Unix(vectors.Now, 0)); err == nil {
			t.Errorf("%s: accepted as %+v", vector.Why, grant)
		}
	}
}

func TestGrantKeysFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	file := &watchedFile{path: path}
	if _, err := grantKeys(file); err == nil {
		t.Fatal("a missing key file was accepted")
	}
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := grantKeys(file); err == nil {
		t.Fatal("a short key was accepted")
	}
	os.WriteFile(path, []byte("\n"+loadVectors(t).Key+"\n\n"+loadVectors(t).OtherKey+"\n"), 0o600)
	keys, err := grantKeys(file)
	if err != nil || len(keys) != 2 || string(keys[0]) != loadVectors(t).Key {
		t.Fatalf("keys %q, %v", keys, err)
	}
}

func TestNormalAuthority(t *testing.T) {
	cases := map[[2]string]string{
		{"API.OpenAI.com", "443"}: "api.openai.com:443",
		{"::1", "8080"}:           "[::1]:8080",
		{"host", "0"}:             "",
		{"host", "65536"}:         "",
		{"host", "0443"}:          "",
		{"host", "+443"}:          "",
		{"", "443"}:               "",
		{"a@b", "443"}:            "",
	}
	for input, want := range cases {
		if got := normalAuthority(input[0], input[1]); got != want {
			t.Errorf("normalAuthority(%q, %q) = %q, want %q", input[0], input[1], got, want)
		}
	}
}

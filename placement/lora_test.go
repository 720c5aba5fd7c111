package placement

import (
	"errors"
	"strings"
	"testing"
)

// Bad LoRA input is refused naming the field and what it takes.
func TestLoRABadInput(t *testing.T) {
	for body, want := range map[string]string{
		`"max_loras":2,"adapters":[{"name":"sql","source":"a/sql"},{"name":"sql","source":"b/sql"}]`: `adapters[1].name: invalid value "sql": a name given once`,
		`"adapters":[{"name":"sql","source":"a/sql"}]`:                                               `adapters: invalid value "sql": with max_loras`,
		`"max_loras":2,"adapters":[{"name":"sql","source":"../../etc/sql"}]`:                         `adapters[0].source: invalid value "../../etc/sql": a directory in the weights dir`,
		`"max_loras":2,"adapters":[{"name":"sql","source":"https://example.com/sql"}]`:               `adapters[0].source: invalid value "https://example.com/sql"`,
		`"max_loras":2,"adapters":[{"name":"sql","source":"/data/../etc"}]`:                          `adapters[0].source: invalid value "/data/../etc"`,
		`"max_loras":2,"adapters":[{"name":"a:b","source":"a/b"}]`:                                   `adapters[0].name: invalid value "a:b"`,
		`"max_loras":2,"adapters":[{"name":"chat","source":"a/b"}]`:                                  `adapters[0].name: invalid value "chat": a name other than the deployment's own`,
		`"max_loras":2,"adapters":[{"name":"sql","path":"a/b"}]`:                                     `adapters: invalid value`,
		`"max_loras":2,"max_lora_rank":12`:                                                           `max_lora_rank: invalid value "12": one of 1, 8, 16`,
		`"max_lora_rank":16`:                                                                         `max_lora_rank: invalid value "16": only with max_loras`,
		`"max_loras":100`:                                                                            `max_loras: invalid value "100": from 1 to 64`,
	} {
		_, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","engine":"vllm",` + body + `}`))
		if err == nil || !errors.Is(err, ErrInvalidDeployment) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	for _, src := range []string{"sql-lora", "org/sql-lora", "/data/adapters/sql-lora", "adapters/team/sql_v2.1"} {
		if _, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","max_loras":1,"adapters":[{"name":"sql","source":"` + src + `"}]}`)); err != nil {
			t.Errorf("source %s: %v", src, err)
		}
	}
}

// The adapter list is registered at runtime, so it leaves the spec
// version alone (adding one restarts nothing), except on llama.cpp, which
// loads adapters only at start; max_loras and max_lora_rank size the
// engine's buffers, so they change it.
func TestLoRASpecVersion(t *testing.T) {
	base := Deployment{Name: "chat", Model: "m", Engine: "vllm", MaxLoras: 2}
	more := base
	more.Adapters = []Adapter{{Name: "sql", Source: "org/sql"}, {Name: "code", Source: "org/code"}}
	if base.SpecVersion() != more.SpecVersion() {
		t.Error("adding adapters changed a vLLM deployment's spec version")
	}
	for name, change := range map[string]func(d *Deployment){
		"max_loras":     func(d *Deployment) { d.MaxLoras = 4 },
		"max_lora_rank": func(d *Deployment) { d.MaxLoraRank = 64 },
	} {
		d := base
		change(&d)
		if d.SpecVersion() == base.SpecVersion() {
			t.Errorf("%s left the spec version unchanged", name)
		}
	}
	lc, lcMore := base, more
	lc.Engine, lcMore.Engine = "llamacpp", "llamacpp"
	if lc.SpecVersion() == lcMore.SpecVersion() {
		t.Error("adding adapters left a llama.cpp deployment's spec version unchanged: it loads them only at start")
	}
}

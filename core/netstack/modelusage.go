package netstack

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Model API providers, by the host a request went to.
const (
	ProviderAnthropic = "anthropic"
	ProviderOpenAI    = "openai"
	ProviderGoogle    = "google"
)

// modelProvider names the model API a host serves, or "".
func modelProvider(host string) string {
	switch {
	case host == "api.anthropic.com":
		return ProviderAnthropic
	case host == "api.openai.com":
		return ProviderOpenAI
	case host == "generativelanguage.googleapis.com", strings.HasSuffix(host, "-aiplatform.googleapis.com"), host == "aiplatform.googleapis.com":
		return ProviderGoogle
	}
	return ""
}

// maxUsageBody bounds what a usage reader keeps of a body that is not an
// event stream (a JSON answer is parsed once it ended); maxEventLine bounds
// one line of an event stream. Past them the usage is not read, and the
// bytes still flow.
const (
	maxUsageBody = 1 << 20
	maxEventLine = 1 << 20
)

// usageReader reads the model and token counts from a model API's answer
// as the bytes go to the guest: from each `data:` line of a server-sent
// event stream, or from a whole JSON body. Usage events report cumulative
// counts, so the last value seen wins.
type usageReader struct {
	stream bool // text/event-stream
	line   []byte
	long   bool // the current line passed maxEventLine
	body   []byte
	over   bool // the body passed maxUsageBody

	Model         string
	Input, Output int64
}

func newUsageReader(contentType string) *usageReader {
	return &usageReader{stream: strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream")}
}

func (u *usageReader) Write(p []byte) {
	if !u.stream {
		if !u.over {
			if len(u.body)+len(p) > maxUsageBody {
				u.over, u.body = true, nil
				return
			}
			u.body = append(u.body, p...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if !u.long {
			if len(u.line)+len(chunk) > maxEventLine {
				u.long, u.line = true, u.line[:0]
			} else {
				u.line = append(u.line, chunk...)
			}
		}
		if i < 0 {
			return
		}
		if !u.long {
			u.eventLine(u.line)
		}
		u.line, u.long = u.line[:0], false
		p = p[i+1:]
	}
}

// End reads a JSON body that ended.
func (u *usageReader) End() {
	if u.stream {
		if len(u.line) > 0 && !u.long {
			u.eventLine(u.line)
		}
		return
	}
	if u.over {
		return
	}
	body := bytes.TrimSpace(u.body)
	if len(body) > 0 && body[0] == '[' {
		// A stream of JSON objects in one array (Google's
		// streamGenerateContent without alt=sse).
		var items []json.RawMessage
		if json.Unmarshal(body, &items) == nil {
			for _, it := range items {
				u.object(it)
			}
		}
		return
	}
	u.object(body)
}

func (u *usageReader) eventLine(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	u.object(bytes.TrimSpace(data))
}

// usageShape holds the places the three providers put usage: Anthropic's
// message_start (message.usage) and message_delta (usage), OpenAI's chat
// chunks (usage) and responses (response.usage), Google's usageMetadata.
type usageShape struct {
	Model        string      `json:"model"`
	ModelVersion string      `json:"modelVersion"`
	Usage        *tokenShape `json:"usage"`
	Metadata     *tokenShape `json:"usageMetadata"`
	Message      *struct {
		Model string      `json:"model"`
		Usage *tokenShape `json:"usage"`
	} `json:"message"`
	Response *struct {
		Model string      `json:"model"`
		Usage *tokenShape `json:"usage"`
	} `json:"response"`
}

type tokenShape struct {
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	PromptCount      *int64 `json:"promptTokenCount"`
	CandidatesCount  *int64 `json:"candidatesTokenCount"`
}

func (u *usageReader) object(data []byte) {
	if len(data) == 0 || data[0] != '{' {
		return
	}
	var s usageShape
	if json.Unmarshal(data, &s) != nil {
		return
	}
	for _, m := range []string{s.Model, s.ModelVersion} {
		if m != "" {
			u.Model = m
		}
	}
	if s.Message != nil {
		if s.Message.Model != "" {
			u.Model = s.Message.Model
		}
		u.tokens(s.Message.Usage)
	}
	if s.Response != nil {
		if s.Response.Model != "" {
			u.Model = s.Response.Model
		}
		u.tokens(s.Response.Usage)
	}
	u.tokens(s.Usage)
	u.tokens(s.Metadata)
}

func (u *usageReader) tokens(t *tokenShape) {
	if t == nil {
		return
	}
	for _, in := range []*int64{t.InputTokens, t.PromptTokens, t.PromptCount} {
		if in != nil && *in >= 0 {
			u.Input = *in
		}
	}
	for _, out := range []*int64{t.OutputTokens, t.CompletionTokens, t.CandidatesCount} {
		if out != nil && *out >= 0 {
			u.Output = *out
		}
	}
}

package builtintools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServerName is the name the gateway routes to this server; its tools are
// seen upstream as "builtin__<tool>".
const ServerName = "builtin"

// Tool names, as served by this server.
const (
	ToolFetchHTTP   = "fetch_http"
	ToolGrepHTTP    = "grep_http"
	ToolHTTPHeaders = "http_headers"
	ToolHTTPGet     = "http_get"
	ToolHTTPPost    = "http_post"
	ToolHTTPPut     = "http_put"
	ToolHTTPPatch   = "http_patch"
	ToolHTTPDelete  = "http_delete"
	ToolHTTPHead    = "http_head"
)

// Output formats of fetch_http.
const (
	formatMarkdown = "markdown"
	formatContent  = "content"
	formatRaw      = "raw"
)

// errorBodyExcerptBytes is how much of an error page fetch_http and
// grep_http quote when the server answers 4xx/5xx.
const errorBodyExcerptBytes = 500

const serverInstructions = "HTTP tools of the Capsem sandbox. Every request, and every redirect it " +
	"follows, is checked against the sandbox's domain allow/block policy and recorded in the " +
	"session ledger. Unless the sandbox allows private networks, connections to loopback, private, " +
	"link-local (including cloud metadata) and other non-public addresses are refused, whether named " +
	"directly, through DNS or by a redirect. Bodies are capped and requests time out. Long output is paginated: " +
	"start_index and max_length count bytes of the returned text (never splitting a character); " +
	"each page says where the next one starts."

// NewServer returns the builtin MCP server with its HTTP tools, enforcing
// cfg. An invalid cfg (see Config.Validate) does not fail here: every
// request is then refused with the configuration error, so a bad policy
// can never mean an open one.
func NewServer(cfg Config, version string) *mcp.Server {
	return newServer(cfg, version, nil)
}

func newServer(cfg Config, version string, hooks *netHooks) *mcp.Server {
	server := mcp.NewServer(
		&mcp.Implementation{Name: ServerName, Title: "Capsem builtin tools", Version: version},
		&mcp.ServerOptions{
			Instructions: serverInstructions,
			// The tool list never changes, and the server does not log to
			// the client.
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		},
	)
	tools := &httpTools{fetcher: newHTTPFetcher(cfg, version, hooks)}
	tools.register(server)
	return server
}

type httpTools struct {
	fetcher *httpFetcher
}

// Tool inputs. Defaults, enums and bounds are added to the inferred schemas
// in register, so the SDK applies and enforces them before a handler runs.

type fetchInput struct {
	URL        string `json:"url" jsonschema:"The http:// or https:// URL to fetch."`
	Format     string `json:"format,omitempty" jsonschema:"markdown: HTML converted to Markdown (default). content: plain text. raw: the body unchanged; binary bodies as base64."`
	StartIndex int    `json:"start_index,omitempty" jsonschema:"Byte offset in the returned text to start from (default 0); use the value a previous page gave."`
	MaxLength  int    `json:"max_length,omitempty" jsonschema:"Maximum bytes of text to return (default 5000)."`
}

type grepInput struct {
	URL          string `json:"url" jsonschema:"The http:// or https:// URL to fetch and search."`
	Pattern      string `json:"pattern" jsonschema:"Case-insensitive regular expression (Go RE2 syntax, no lookaround or backreferences), matched line by line."`
	ContextLines int    `json:"context_lines,omitempty" jsonschema:"Lines of context shown before and after each matching line (default 3)."`
	MaxMatches   int    `json:"max_matches,omitempty" jsonschema:"Maximum matching lines shown (default 50); all matches are counted."`
	StartIndex   int    `json:"start_index,omitempty" jsonschema:"Byte offset in the match report to start from (default 0)."`
	MaxLength    int    `json:"max_length,omitempty" jsonschema:"Maximum bytes of the match report to return (default 5000)."`
	Raw          bool   `json:"raw,omitempty" jsonschema:"Search the raw body instead of the text extracted from HTML (default false)."`
}

type headersInput struct {
	URL    string `json:"url" jsonschema:"The http:// or https:// URL to query."`
	Method string `json:"method,omitempty" jsonschema:"HEAD (default) or GET. GET is for servers that answer HEAD wrongly; its body is not read."`
}

type httpInput struct {
	URL        string            `json:"url" jsonschema:"The http:// or https:// URL."`
	Headers    map[string]string `json:"headers,omitempty" jsonschema:"Request headers, name to value. Host, Content-Length, Transfer-Encoding and Connection are set by the client and refused here."`
	StartIndex int               `json:"start_index,omitempty" jsonschema:"Byte offset in the response body text to start from (default 0); use next_start_index from a previous page."`
	MaxLength  int               `json:"max_length,omitempty" jsonschema:"Maximum bytes of body text to return (default 5000)."`
}

type httpBodyInput struct {
	URL        string            `json:"url" jsonschema:"The http:// or https:// URL."`
	Headers    map[string]string `json:"headers,omitempty" jsonschema:"Request headers, name to value, e.g. Content-Type. Host, Content-Length, Transfer-Encoding and Connection are set by the client and refused here."`
	Body       string            `json:"body,omitempty" jsonschema:"Request body, sent as is."`
	StartIndex int               `json:"start_index,omitempty" jsonschema:"Byte offset in the response body text to start from (default 0); use next_start_index from a previous page."`
	MaxLength  int               `json:"max_length,omitempty" jsonschema:"Maximum bytes of body text to return (default 5000)."`
}

// Annotation sets. Reads are safe to repeat; POST and PATCH are not
// idempotent; every write may destroy remote state. All reach the open web.
var (
	readOnlyAnnotations = func(title string) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: title, ReadOnlyHint: true, DestructiveHint: boolPointer(false), IdempotentHint: true, OpenWorldHint: boolPointer(true)}
	}
	writeAnnotations = func(title string, idempotent bool) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: title, ReadOnlyHint: false, DestructiveHint: boolPointer(true), IdempotentHint: idempotent, OpenWorldHint: boolPointer(true)}
	}
)

func boolPointer(b bool) *bool { return &b }

const (
	policyNote     = " The URL and every redirect are checked against the sandbox's domain policy, and private or loopback addresses are refused unless allowed."
	jsonOutputNote = " Returns a JSON object: url, final_url, method, status, status_text, headers, body, " +
		"body_encoding (utf-8 or base64), start_index, end_index, total_length, next_start_index (when more " +
		"remains), truncated (the body field is not the whole body), body_limit_reached (the response was " +
		"longer than the body cap). Offsets count bytes of the body text."
)

func (t *httpTools) register(server *mcp.Server) {
	mcp.AddTool(server, &mcp.Tool{
		Name: ToolFetchHTTP,
		Description: "Fetch a URL with GET and return its readable content, with a short header (URL, status, " +
			"content type, length, pagination). HTML becomes Markdown (format=markdown, the default) or plain " +
			"text (format=content); other text is returned as is. Binary content (images, audio, video, fonts, " +
			"PDF, archives, executables) is refused unless format=raw, which returns the body unchanged, binary " +
			"as base64. A 4xx/5xx status is an error." + policyNote,
		InputSchema: inputSchema[fetchInput](func(properties map[string]*jsonschema.Schema) {
			properties["format"].Enum = []any{formatMarkdown, formatContent, formatRaw}
			properties["format"].Default = json.RawMessage(`"markdown"`)
			pagingSchema(properties)
		}),
		Annotations: readOnlyAnnotations("Fetch web page"),
	}, t.fetchHTTP)

	mcp.AddTool(server, &mcp.Tool{
		Name: ToolGrepHTTP,
		Description: "Fetch a URL with GET and search its text line by line with a case-insensitive regular " +
			"expression, showing each matching line (>>>) with numbered context lines. HTML is searched as " +
			"extracted text unless raw=true. Binary content is refused unless raw=true. A 4xx/5xx status is " +
			"an error." + policyNote,
		InputSchema: inputSchema[grepInput](func(properties map[string]*jsonschema.Schema) {
			properties["pattern"].MinLength = intPointer(1)
			properties["pattern"].MaxLength = intPointer(maxPatternBytes)
			setIntegerRange(properties["context_lines"], defaultContextLines, 0, maxContextLines)
			setIntegerRange(properties["max_matches"], defaultMaxMatches, 1, maxMaxMatches)
			properties["raw"].Default = json.RawMessage(`false`)
			pagingSchema(properties)
		}),
		Annotations: readOnlyAnnotations("Search web page"),
	}, t.grepHTTP)

	mcp.AddTool(server, &mcp.Tool{
		Name: ToolHTTPHeaders,
		Description: "Return the status and response headers of a URL without its body, as a JSON object: " +
			"url, final_url, method, status, status_text, headers." + policyNote,
		InputSchema: inputSchema[headersInput](func(properties map[string]*jsonschema.Schema) {
			properties["method"].Enum = []any{http.MethodHead, http.MethodGet}
			properties["method"].Default = json.RawMessage(`"HEAD"`)
		}),
		Annotations: readOnlyAnnotations("Get HTTP headers"),
	}, t.httpHeaders)

	bodylessTools := []struct {
		name, method, title, summary string
	}{
		{ToolHTTPGet, http.MethodGet, "HTTP GET", "Send an HTTP GET request and return the response."},
		{ToolHTTPHead, http.MethodHead, "HTTP HEAD", "Send an HTTP HEAD request and return the status and headers (the body is empty)."},
	}
	for _, tool := range bodylessTools {
		mcp.AddTool(server, &mcp.Tool{
			Name:        tool.name,
			Description: tool.summary + jsonOutputNote + policyNote,
			InputSchema: inputSchema[httpInput](pagingSchema),
			Annotations: readOnlyAnnotations(tool.title),
		}, t.bodylessRequest(tool.method))
	}

	bodyTools := []struct {
		name, method, title, summary string
		idempotent                   bool
	}{
		{ToolHTTPPost, http.MethodPost, "HTTP POST", "Send an HTTP POST request with an optional body and return the response.", false},
		{ToolHTTPPut, http.MethodPut, "HTTP PUT", "Send an HTTP PUT request with an optional body and return the response.", true},
		{ToolHTTPPatch, http.MethodPatch, "HTTP PATCH", "Send an HTTP PATCH request with an optional body and return the response.", false},
		{ToolHTTPDelete, http.MethodDelete, "HTTP DELETE", "Send an HTTP DELETE request (with a body only if one is given) and return the response.", true},
	}
	for _, tool := range bodyTools {
		mcp.AddTool(server, &mcp.Tool{
			Name:        tool.name,
			Description: tool.summary + jsonOutputNote + policyNote,
			InputSchema: inputSchema[httpBodyInput](pagingSchema),
			Annotations: writeAnnotations(tool.title, tool.idempotent),
		}, t.bodyRequest(tool.method))
	}
}

// inputSchema infers a tool's input schema from its struct (descriptions
// come from jsonschema tags) and lets the caller add what tags cannot say.
func inputSchema[T any](refine func(properties map[string]*jsonschema.Schema)) *jsonschema.Schema {
	schema, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("builtintools: inferring input schema: %v", err)) // static types: a programming error
	}
	refine(schema.Properties)
	return schema
}

func pagingSchema(properties map[string]*jsonschema.Schema) {
	setIntegerRange(properties["start_index"], 0, 0, -1)
	setIntegerRange(properties["max_length"], defaultMaxLength, 1, maxMaxLength)
}

// setIntegerRange sets a default and bounds; a negative maximum means none.
func setIntegerRange(schema *jsonschema.Schema, defaultValue, minimum, maximum int) {
	schema.Default = json.RawMessage(strconv.Itoa(defaultValue))
	schema.Minimum = floatPointer(float64(minimum))
	if maximum >= 0 {
		schema.Maximum = floatPointer(float64(maximum))
	}
}

func floatPointer(f float64) *float64 { return &f }
func intPointer(i int) *int           { return &i }

// toolResult wraps a handler's outcome: text on success, the error's text
// with IsError on failure, and the call's net events in _meta either way.
func toolResult(log *eventLog, text string, err error) *mcp.CallToolResult {
	result := &mcp.CallToolResult{Meta: mcp.Meta{MetaKeyNetEvents: log.snapshot()}}
	if err != nil {
		result.IsError = true
		text = err.Error()
	}
	result.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	return result
}

func (t *httpTools) fetchHTTP(ctx context.Context, _ *mcp.CallToolRequest, input fetchInput) (*mcp.CallToolResult, any, error) {
	log := &eventLog{}
	text, err := t.fetchText(ctx, log, input)
	return toolResult(log, text, err), nil, nil
}

func (t *httpTools) fetchText(ctx context.Context, log *eventLog, input fetchInput) (string, error) {
	format := input.Format
	if format == "" {
		format = formatMarkdown
	}
	if format != formatMarkdown && format != formatContent && format != formatRaw {
		return "", fmt.Errorf("format must be %q, %q or %q, got %q", formatMarkdown, formatContent, formatRaw, format)
	}
	startIndex, maxLength, err := normalizePaging(input.StartIndex, input.MaxLength)
	if err != nil {
		return "", err
	}
	response, err := t.fetcher.fetch(ctx, log, textFetchRequest(input.URL, format == formatRaw))
	if err != nil {
		return "", err
	}
	if err := statusError(response); err != nil {
		return "", err
	}

	mediaType, charset := sniffedMediaType(response.header, response.body)
	text, isText := decodeText(response.body, charset)
	var header strings.Builder
	writeResponseHeader(&header, response)
	var extracted extractedPage
	switch {
	case format == formatRaw && !isText:
		text = base64.StdEncoding.EncodeToString(response.body)
		header.WriteString("Encoding: base64\n")
	case format != formatRaw && isHTMLMediaType(mediaType):
		mode := extractMarkdown
		if format == formatContent {
			mode = extractPlainText
		}
		extracted = extractHTML(response.body, mode, response.finalURL)
		text = extracted.text
		if extracted.title != "" {
			header.WriteString("Title: " + extracted.title + "\n")
		}
	}
	page, err := paginateText(text, startIndex, maxLength)
	if err != nil {
		return "", err
	}
	writePagingHeader(&header, page)
	if response.bodyLimitReached {
		fmt.Fprintf(&header, "Note: the response body was longer than the %d-byte limit; only the first %d bytes were read.\n", t.fetcher.cfg.MaxBodyBytes, t.fetcher.cfg.MaxBodyBytes)
	}
	if extracted.truncated {
		header.WriteString("Note: the extracted text reached its size limit; the rest of the page was dropped.\n")
	}
	return header.String() + "\n" + page.text, nil
}

// textFetchRequest is the GET that fetch_http and grep_http make. Binary
// responses are refused before their body is read when the header says so,
// or after sniffing when the server sent no Content-Type.
func textFetchRequest(rawURL string, allowBinary bool) fetchRequest {
	return fetchRequest{
		method:   http.MethodGet,
		url:      rawURL,
		readBody: true,
		checkHeaders: func(response *http.Response) error {
			contentType := response.Header.Get("Content-Type")
			if allowBinary || contentType == "" {
				return nil
			}
			if mediaType, _ := mediaTypeOf(contentType); isBinaryMediaType(mediaType) {
				return binaryRefusal(mediaType)
			}
			return nil
		},
		checkBody: func(response *http.Response, body []byte) error {
			if allowBinary || response.Header.Get("Content-Type") != "" {
				return nil
			}
			if mediaType, _ := sniffedMediaType(response.Header, body); isBinaryMediaType(mediaType) {
				return binaryRefusal(mediaType)
			}
			return nil
		},
	}
}

func binaryRefusal(mediaType string) error {
	return fmt.Errorf("refused binary content (%s): use format=raw (fetch_http) or raw=true (grep_http), or http_get, to read it", mediaType)
}

// statusError makes a 4xx/5xx answer an error for the text tools, quoting
// the start of the body since APIs explain themselves there.
func statusError(response *fetchResponse) error {
	if response.statusCode < 400 {
		return nil
	}
	message := fmt.Sprintf("HTTP %s from %s", response.status, response.finalURL.Redacted())
	_, charset := sniffedMediaType(response.header, response.body)
	if text, _ := decodeText(response.body, charset); strings.TrimSpace(text) != "" {
		excerpt := collapseWhitespace(text)
		if len(excerpt) > errorBodyExcerptBytes {
			excerpt = excerpt[:characterStart(excerpt, errorBodyExcerptBytes)] + "…"
		}
		message += ": " + excerpt
	}
	return errors.New(message)
}

func writeResponseHeader(header *strings.Builder, response *fetchResponse) {
	header.WriteString("URL: " + response.finalURL.Redacted() + "\n")
	if response.finalURL.String() != response.requestURL.String() {
		header.WriteString("Redirected from: " + response.requestURL.Redacted() + "\n")
	}
	header.WriteString("Status: " + response.status + "\n")
	if contentType := response.header.Get("Content-Type"); contentType != "" {
		header.WriteString("Content-Type: " + contentType + "\n")
	}
}

func writePagingHeader(header *strings.Builder, page textPage) {
	fmt.Fprintf(header, "Content length: %d bytes\n", page.total)
	if page.start > 0 || page.hasMore() {
		fmt.Fprintf(header, "Showing: bytes %d-%d of %d.", page.start, page.end, page.total)
		if page.hasMore() {
			fmt.Fprintf(header, " Remaining: %d bytes; use start_index=%d to continue.", page.total-page.end, page.end)
		}
		header.WriteString("\n")
	}
}

func (t *httpTools) grepHTTP(ctx context.Context, _ *mcp.CallToolRequest, input grepInput) (*mcp.CallToolResult, any, error) {
	log := &eventLog{}
	text, err := t.grepText(ctx, log, input)
	return toolResult(log, text, err), nil, nil
}

func (t *httpTools) grepText(ctx context.Context, log *eventLog, input grepInput) (string, error) {
	pattern, err := compileGrepPattern(input.Pattern)
	if err != nil {
		return "", err
	}
	if input.ContextLines < 0 || input.ContextLines > maxContextLines {
		return "", fmt.Errorf("context_lines must be between 0 and %d, got %d", maxContextLines, input.ContextLines)
	}
	maxMatches := input.MaxMatches
	if maxMatches == 0 {
		maxMatches = defaultMaxMatches
	}
	if maxMatches < 0 || maxMatches > maxMaxMatches {
		return "", fmt.Errorf("max_matches must be between 1 and %d, got %d", maxMaxMatches, maxMatches)
	}
	startIndex, maxLength, err := normalizePaging(input.StartIndex, input.MaxLength)
	if err != nil {
		return "", err
	}
	response, err := t.fetcher.fetch(ctx, log, textFetchRequest(input.URL, input.Raw))
	if err != nil {
		return "", err
	}
	if err := statusError(response); err != nil {
		return "", err
	}
	mediaType, charset := sniffedMediaType(response.header, response.body)
	text, _ := decodeText(response.body, charset)
	if !input.Raw && isHTMLMediaType(mediaType) {
		text = extractHTML(response.body, extractPlainText, response.finalURL).text
	}
	found := grepText(text, pattern, input.ContextLines, maxMatches)

	var header strings.Builder
	header.WriteString("URL: " + response.finalURL.Redacted() + "\n")
	header.WriteString("Pattern: " + input.Pattern + "\n")
	fmt.Fprintf(&header, "Matches found: %d", found.totalMatches)
	if found.shownMatches < found.totalMatches {
		fmt.Fprintf(&header, " (showing the first %d; raise max_matches to see more)", found.shownMatches)
	}
	header.WriteString("\n")
	if response.bodyLimitReached {
		fmt.Fprintf(&header, "Note: only the first %d bytes of the response were searched (body size limit).\n", t.fetcher.cfg.MaxBodyBytes)
	}
	if found.report == "" {
		return header.String(), nil
	}
	page, err := paginateText(found.report, startIndex, maxLength)
	if err != nil {
		return "", err
	}
	if page.start > 0 || page.hasMore() {
		writePagingHeader(&header, page)
	}
	return header.String() + "\n" + page.text, nil
}

// headersJSON is http_headers' output.
type headersJSON struct {
	URL        string            `json:"url"`
	FinalURL   string            `json:"final_url"`
	Method     string            `json:"method"`
	Status     int               `json:"status"`
	StatusText string            `json:"status_text"`
	Headers    map[string]string `json:"headers"`
}

func (t *httpTools) httpHeaders(ctx context.Context, _ *mcp.CallToolRequest, input headersInput) (*mcp.CallToolResult, any, error) {
	log := &eventLog{}
	text, err := t.headersText(ctx, log, input)
	return toolResult(log, text, err), nil, nil
}

func (t *httpTools) headersText(ctx context.Context, log *eventLog, input headersInput) (string, error) {
	method := strings.ToUpper(strings.TrimSpace(input.Method))
	if method == "" {
		method = http.MethodHead
	}
	if method != http.MethodHead && method != http.MethodGet {
		return "", fmt.Errorf("method must be HEAD or GET, got %q", input.Method)
	}
	response, err := t.fetcher.fetch(ctx, log, fetchRequest{method: method, url: input.URL})
	if err != nil {
		return "", err
	}
	return marshalJSON(headersJSON{
		URL:        response.requestURL.Redacted(),
		FinalURL:   response.finalURL.Redacted(),
		Method:     response.finalMethod,
		Status:     response.statusCode,
		StatusText: statusText(response),
		Headers:    flattenHeaders(response.header),
	})
}

// httpResponseJSON is the output of the http_<method> tools.
type httpResponseJSON struct {
	URL              string            `json:"url"`
	FinalURL         string            `json:"final_url"`
	Method           string            `json:"method"`
	Status           int               `json:"status"`
	StatusText       string            `json:"status_text"`
	Headers          map[string]string `json:"headers"`
	Body             string            `json:"body"`
	BodyEncoding     string            `json:"body_encoding"`
	StartIndex       int               `json:"start_index"`
	EndIndex         int               `json:"end_index"`
	TotalLength      int               `json:"total_length"`
	NextStartIndex   *int              `json:"next_start_index,omitempty"`
	Truncated        bool              `json:"truncated"`
	BodyLimitReached bool              `json:"body_limit_reached"`
}

func (t *httpTools) bodylessRequest(method string) mcp.ToolHandlerFor[httpInput, any] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, input httpInput) (*mcp.CallToolResult, any, error) {
		log := &eventLog{}
		text, err := t.exchangeJSON(ctx, log, fetchRequest{method: method, url: input.URL, headers: input.Headers, readBody: true}, input.StartIndex, input.MaxLength)
		return toolResult(log, text, err), nil, nil
	}
}

func (t *httpTools) bodyRequest(method string) mcp.ToolHandlerFor[httpBodyInput, any] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, input httpBodyInput) (*mcp.CallToolResult, any, error) {
		log := &eventLog{}
		request := fetchRequest{method: method, url: input.URL, headers: input.Headers, body: input.Body, readBody: true}
		// POST, PUT and PATCH always carry a body (possibly empty);
		// DELETE only when one is given.
		request.hasBody = method != http.MethodDelete || input.Body != ""
		text, err := t.exchangeJSON(ctx, log, request, input.StartIndex, input.MaxLength)
		return toolResult(log, text, err), nil, nil
	}
}

// exchangeJSON runs one http_<method> call and renders its JSON output.
func (t *httpTools) exchangeJSON(ctx context.Context, log *eventLog, request fetchRequest, startIndex, maxLength int) (string, error) {
	startIndex, maxLength, err := normalizePaging(startIndex, maxLength)
	if err != nil {
		return "", err
	}
	response, err := t.fetcher.fetch(ctx, log, request)
	if err != nil {
		return "", err
	}
	_, charset := sniffedMediaType(response.header, response.body)
	body, isText := decodeText(response.body, charset)
	encoding := "utf-8"
	if !isText {
		body, encoding = base64.StdEncoding.EncodeToString(response.body), "base64"
	}
	page, err := paginateText(body, startIndex, maxLength)
	if err != nil {
		return "", fmt.Errorf("%w (the request was sent; status %d)", err, response.statusCode)
	}
	output := httpResponseJSON{
		URL:              response.requestURL.Redacted(),
		FinalURL:         response.finalURL.Redacted(),
		Method:           response.finalMethod,
		Status:           response.statusCode,
		StatusText:       statusText(response),
		Headers:          flattenHeaders(response.header),
		Body:             page.text,
		BodyEncoding:     encoding,
		StartIndex:       page.start,
		EndIndex:         page.end,
		TotalLength:      page.total,
		Truncated:        page.hasMore() || page.start > 0 || response.bodyLimitReached,
		BodyLimitReached: response.bodyLimitReached,
	}
	if page.hasMore() {
		next := page.end
		output.NextStartIndex = &next
	}
	return marshalJSON(output)
}

func statusText(response *fetchResponse) string {
	if text, ok := strings.CutPrefix(response.status, strconv.Itoa(response.statusCode)+" "); ok {
		return text
	}
	return http.StatusText(response.statusCode)
}

// flattenHeaders joins repeated headers with ", " (the HTTP list form) so
// the JSON stays a flat name-to-value object.
func flattenHeaders(header http.Header) map[string]string {
	flat := make(map[string]string, len(header))
	for name, values := range header {
		flat[name] = strings.Join(values, ", ")
	}
	return flat
}

// marshalJSON renders compact JSON without HTML escaping, so bodies stay
// readable and the text is exactly what a client parses.
func marshalJSON(value any) (string, error) {
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return "", fmt.Errorf("encoding JSON output: %w", err)
	}
	return strings.TrimSuffix(buffer.String(), "\n"), nil
}

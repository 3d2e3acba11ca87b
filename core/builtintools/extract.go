package builtintools

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/html"
)

// extractMode selects what extractHTML produces.
type extractMode int

const (
	// extractMarkdown keeps structure as Markdown: headings, links, lists,
	// emphasis, code, pre blocks, blockquotes, rules.
	extractMarkdown extractMode = iota
	// extractPlainText keeps only text, with line breaks between blocks
	// and "- " before list items.
	extractPlainText
)

// extractedPage is the readable content of an HTML document.
type extractedPage struct {
	title string
	text  string
	// truncated is set when the output hit its size bound (see
	// extractHTML) and the rest of the document was dropped.
	truncated bool
}

// skippedElements hold no readable text: code, styling, fallbacks, vector
// graphics and inert templates.
var skippedElements = map[string]bool{
	"script": true, "style": true, "noscript": true, "svg": true, "template": true,
	"iframe": true, "object": true, "canvas": true,
}

// paragraphElements are separated from their neighbours by a blank line;
// lineElements by a line break.
var (
	paragraphElements = map[string]bool{
		"p": true, "table": true, "figure": true, "details": true, "dl": true, "form": true, "fieldset": true,
	}
	lineElements = map[string]bool{
		"div": true, "section": true, "article": true, "header": true, "footer": true, "main": true,
		"nav": true, "aside": true, "figcaption": true, "address": true, "summary": true, "dt": true,
		"dd": true, "caption": true, "center": true, "tr": true, "li": true, "body": true,
		"option": true, "legend": true, "hgroup": true, "menu": true,
	}
	headingLevels = map[string]int{"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
	// emphasisMarkers are inline elements rendered with Markdown markers.
	emphasisMarkers = map[string]string{
		"b": "**", "strong": "**", "i": "*", "em": "*", "code": "`", "kbd": "`", "samp": "`", "tt": "`",
		"s": "~~", "del": "~~", "strike": "~~",
	}
)

// extractHTML renders an HTML document as Markdown or plain text. It uses
// the streaming tokenizer rather than the tree builder: the work is linear
// in the input, with no recursion that hostile nesting could deepen. Base
// resolves relative links (nil leaves them as written). The output is
// bounded to about twice the input so link expansion cannot balloon it.
func extractHTML(source []byte, mode extractMode, base *url.URL) extractedPage {
	renderer := &htmlRenderer{
		markdown: mode == extractMarkdown,
		base:     base,
		limit:    2*len(source) + 4096,
	}
	tokenizer := html.NewTokenizer(bytes.NewReader(source))
	for !renderer.truncated {
		tokenType := tokenizer.Next()
		if tokenType == html.ErrorToken {
			break // io.EOF, or input the tokenizer cannot continue past
		}
		renderer.token(tokenizer, tokenType)
	}
	renderer.closeAll()
	return extractedPage{
		// The title skips the text path, so it is made valid UTF-8 here.
		title:     collapseWhitespace(strings.ToValidUTF8(renderer.title.String(), "\uFFFD")),
		text:      tidyLines(renderer.out),
		truncated: renderer.truncated,
	}
}

type listLevel struct {
	ordered bool
	next    int
}

// inlineSpan is an open emphasis or link; if nothing is written inside it,
// closing it removes the opening marker and restores the state from before
// it, so empty tags leave no "[]()" or "****".
type inlineSpan struct {
	tag        string
	closing    string // text written when the span closes; "" writes nothing
	contentAt  int    // len(out) right after the opening marker
	savedState rendererState
}

// rendererState is what opening a span may change before any text arrives.
type rendererState struct {
	outLength     int
	pendingBreaks int
	pendingSpace  bool
	lineMarker    string
}

type htmlRenderer struct {
	markdown bool
	base     *url.URL
	limit    int

	out           []byte
	pendingBreaks int // newlines owed before the next content (0–2)
	// breakQuoteDepth is the shallowest quote depth at which the owed
	// breaks were asked for: a blank line between a quote and the text
	// around it is not part of the quote.
	breakQuoteDepth int
	pendingSpace    bool   // a collapsed run of whitespace is owed
	suppressSpace   bool   // just opened a marker: drop whitespace right after it
	lineMarker      string // list bullet or heading hashes for the next fresh line
	quoteDepth      int
	lists           []listLevel
	preDepth        int
	preFresh        bool // the next pre text drops one leading newline, as HTML does
	cellsInRow      int
	spans           []inlineSpan

	skipTag   string // element whose content is being skipped
	skipDepth int

	inTitle   bool
	titleDone bool
	title     strings.Builder

	truncated bool
}

func (r *htmlRenderer) token(tokenizer *html.Tokenizer, tokenType html.TokenType) {
	switch tokenType {
	case html.TextToken:
		if r.skipDepth > 0 {
			return
		}
		text := string(tokenizer.Text())
		if r.inTitle {
			if !r.titleDone {
				r.title.WriteString(text)
			}
			return
		}
		r.text(text)
	case html.StartTagToken, html.SelfClosingTagToken:
		nameBytes, hasAttributes := tokenizer.TagName()
		name := string(nameBytes)
		attributes := map[string]string{}
		for hasAttributes {
			var key, value []byte
			key, value, hasAttributes = tokenizer.TagAttr()
			if _, seen := attributes[string(key)]; !seen {
				attributes[string(key)] = string(value)
			}
		}
		if r.skipDepth > 0 {
			if name == r.skipTag && tokenType == html.StartTagToken {
				r.skipDepth++
			}
			return
		}
		if skippedElements[name] {
			if tokenType == html.StartTagToken {
				r.skipTag, r.skipDepth = name, 1
			}
			return
		}
		r.startTag(name, attributes)
	case html.EndTagToken:
		nameBytes, _ := tokenizer.TagName()
		name := string(nameBytes)
		if r.skipDepth > 0 {
			if name == r.skipTag {
				r.skipDepth--
			}
			return
		}
		r.endTag(name)
	}
}

func (r *htmlRenderer) startTag(name string, attributes map[string]string) {
	if level, ok := headingLevels[name]; ok {
		r.requestBreak(2)
		if r.markdown {
			r.lineMarker = strings.Repeat("#", level) + " "
		}
		return
	}
	if marker, ok := emphasisMarkers[name]; ok {
		if r.markdown && r.preDepth == 0 {
			r.openSpan(name, marker, marker)
		} else {
			r.openSpan(name, "", "")
		}
		return
	}
	switch name {
	case "title":
		r.inTitle = true
	case "a":
		if href := r.linkTarget(attributes["href"]); href != "" && r.markdown && r.preDepth == 0 {
			r.openSpan(name, "[", "]("+href+")")
		} else {
			r.openSpan(name, "", "")
		}
	case "br":
		if r.preDepth > 0 {
			r.flushBreaks()
			r.write("\n")
			return
		}
		r.requestBreak(min(r.pendingBreaks+1, 2))
	case "hr":
		r.requestBreak(2)
		if r.markdown {
			r.beginContent()
			r.write("---")
			r.requestBreak(2)
		}
	case "img":
		if alt := collapseWhitespace(attributes["alt"]); alt != "" {
			r.beginContent()
			r.write("[image: " + alt + "]")
			r.suppressSpace = false
		}
	case "pre", "listing", "xmp", "plaintext":
		r.requestBreak(2)
		r.preDepth++
		r.preFresh = true
		if r.markdown && r.preDepth == 1 {
			r.beginContent()
			r.write("```\n")
		}
	case "blockquote":
		r.requestBreak(2)
		r.quoteDepth++
	case "ul", "ol":
		if len(r.lists) == 0 {
			r.requestBreak(2)
		} else {
			r.requestBreak(1)
		}
		level := listLevel{ordered: name == "ol", next: 1}
		if start, err := strconv.Atoi(strings.TrimSpace(attributes["start"])); err == nil && start >= 0 && start < 1_000_000 {
			level.next = start
		}
		r.lists = append(r.lists, level)
	case "li":
		r.requestBreak(1)
		r.lineMarker = "- "
		if n := len(r.lists); n > 0 && r.lists[n-1].ordered {
			r.lineMarker = strconv.Itoa(r.lists[n-1].next) + ". "
			r.lists[n-1].next++
		}
	case "tr":
		r.requestBreak(1)
		r.cellsInRow = 0
	case "td", "th":
		if r.cellsInRow > 0 && !r.atLineStart() && r.pendingBreaks == 0 {
			r.write(" |")
			r.pendingSpace = true
		}
		r.cellsInRow++
	default:
		if paragraphElements[name] {
			r.requestBreak(2)
		} else if lineElements[name] {
			r.requestBreak(1)
		}
	}
}

func (r *htmlRenderer) endTag(name string) {
	if _, ok := headingLevels[name]; ok {
		r.lineMarker = ""
		r.requestBreak(2)
		return
	}
	if _, ok := emphasisMarkers[name]; ok {
		r.closeSpan(name)
		return
	}
	switch name {
	case "title":
		if r.inTitle {
			r.inTitle = false
			r.titleDone = true
		}
	case "a":
		r.closeSpan(name)
	case "pre", "listing", "xmp":
		if r.preDepth == 0 {
			return
		}
		r.preDepth--
		r.preFresh = false
		if r.markdown && r.preDepth == 0 {
			r.flushBreaks()
			if !r.atLineStart() {
				r.write("\n")
			}
			r.write("```")
		}
		r.requestBreak(2)
	case "blockquote":
		if r.quoteDepth > 0 {
			r.quoteDepth--
		}
		r.requestBreak(2)
	case "ul", "ol":
		if len(r.lists) > 0 {
			r.lists = r.lists[:len(r.lists)-1]
		}
		if len(r.lists) == 0 {
			r.requestBreak(2)
		} else {
			r.requestBreak(1)
		}
	case "li", "tr":
		r.requestBreak(1)
	default:
		if paragraphElements[name] {
			r.requestBreak(2)
		} else if lineElements[name] {
			r.requestBreak(1)
		}
	}
}

// text writes character data: verbatim inside pre, otherwise with runs of
// whitespace collapsed to one space.
func (r *htmlRenderer) text(text string) {
	if r.preDepth > 0 {
		if r.preFresh {
			text = strings.TrimPrefix(strings.TrimPrefix(text, "\r"), "\n")
			r.preFresh = false
		}
		if text == "" {
			return
		}
		r.flushBreaks()
		r.write(text)
		return
	}
	for text != "" {
		wordStart := strings.IndexFunc(text, func(c rune) bool { return !unicode.IsSpace(c) })
		if wordStart != 0 {
			if !r.suppressSpace {
				r.pendingSpace = true
			}
			if wordStart < 0 {
				return
			}
			text = text[wordStart:]
		}
		wordEnd := strings.IndexFunc(text, unicode.IsSpace)
		if wordEnd < 0 {
			wordEnd = len(text)
		}
		r.beginContent()
		r.write(text[:wordEnd])
		r.suppressSpace = false
		text = text[wordEnd:]
	}
}

// requestBreak asks for at least n newlines before the next content.
func (r *htmlRenderer) requestBreak(n int) {
	if r.pendingBreaks == 0 || r.quoteDepth < r.breakQuoteDepth {
		r.breakQuoteDepth = r.quoteDepth
	}
	r.pendingBreaks = max(r.pendingBreaks, n)
	r.pendingSpace = false
}

// flushBreaks writes the newlines owed, counting those already written.
// Blank lines inside a Markdown blockquote keep their ">" so the quote
// stays one block.
func (r *htmlRenderer) flushBreaks() {
	if len(r.out) == 0 {
		r.pendingBreaks = 0 // no leading blank lines
		return
	}
	for have := r.trailingNewlines(); have < r.pendingBreaks; have++ {
		if depth := min(r.quoteDepth, r.breakQuoteDepth); r.markdown && depth > 0 && r.atLineStart() {
			r.write(strings.Repeat(">", depth))
		}
		r.write("\n")
	}
	r.pendingBreaks = 0
}

// beginContent prepares for visible output: owed breaks, then either the
// line prefix (quote marks, list indentation, bullet or heading marker) on
// a fresh line, or the owed space mid-line.
func (r *htmlRenderer) beginContent() {
	r.flushBreaks()
	if r.atLineStart() {
		if r.markdown && r.quoteDepth > 0 {
			r.write(strings.Repeat("> ", r.quoteDepth))
		}
		if depth := len(r.lists); depth > 0 {
			indent := strings.Repeat("  ", depth-1)
			if r.lineMarker == "" {
				indent += "  " // continuation line: align under the item text
			}
			r.write(indent)
		}
		r.write(r.lineMarker)
		r.lineMarker = ""
	} else if r.pendingSpace {
		r.write(" ")
	}
	r.pendingSpace = false
}

func (r *htmlRenderer) openSpan(tag, opening, closing string) {
	span := inlineSpan{tag: tag, closing: closing, savedState: rendererState{
		outLength: len(r.out), pendingBreaks: r.pendingBreaks, pendingSpace: r.pendingSpace, lineMarker: r.lineMarker,
	}}
	if opening != "" {
		r.beginContent()
		r.write(opening)
		r.suppressSpace = true
	}
	span.contentAt = len(r.out)
	r.spans = append(r.spans, span)
}

// closeSpan closes the innermost open span with this tag and any opened
// inside it; a stray end tag with no open span is ignored.
func (r *htmlRenderer) closeSpan(tag string) {
	for i := len(r.spans) - 1; i >= 0; i-- {
		if r.spans[i].tag != tag {
			continue
		}
		for len(r.spans) > i {
			r.closeInnermostSpan()
		}
		return
	}
}

func (r *htmlRenderer) closeInnermostSpan() {
	span := r.spans[len(r.spans)-1]
	r.spans = r.spans[:len(r.spans)-1]
	if span.closing == "" {
		return
	}
	if len(r.out) == span.contentAt {
		// Nothing inside: undo the opening marker and what preceded it.
		owedSpace := r.pendingSpace
		r.out = r.out[:span.savedState.outLength]
		r.pendingBreaks = span.savedState.pendingBreaks
		r.lineMarker = span.savedState.lineMarker
		r.pendingSpace = span.savedState.pendingSpace || owedSpace
		r.suppressSpace = false
		return
	}
	r.write(span.closing)
}

// closeAll ends whatever the document left open.
func (r *htmlRenderer) closeAll() {
	for len(r.spans) > 0 {
		r.closeInnermostSpan()
	}
	if r.markdown && r.preDepth > 0 {
		if !r.atLineStart() {
			r.write("\n")
		}
		r.write("```")
	}
}

// linkTarget resolves an href for Markdown, or returns "" for links that
// lead nowhere useful (empty, in-page anchors, script).
func (r *htmlRenderer) linkTarget(href string) string {
	href = strings.TrimSpace(href)
	if href == "" || strings.HasPrefix(href, "#") {
		return ""
	}
	parsed, err := url.Parse(href)
	if err != nil {
		return ""
	}
	switch strings.ToLower(parsed.Scheme) {
	case "javascript", "data", "vbscript":
		return ""
	}
	if r.base != nil {
		parsed = r.base.ResolveReference(parsed)
	}
	return parsed.String()
}

func (r *htmlRenderer) write(s string) {
	if len(r.out)+len(s) > r.limit {
		r.truncated = true
		return
	}
	r.out = append(r.out, s...)
}

func (r *htmlRenderer) atLineStart() bool {
	return len(r.out) == 0 || r.out[len(r.out)-1] == '\n'
}

func (r *htmlRenderer) trailingNewlines() int {
	count := 0
	for i := len(r.out) - 1; i >= 0 && r.out[i] == '\n' && count < 2; i-- {
		count++
	}
	return count
}

// tidyLines makes the output valid UTF-8, strips trailing spaces, keeps at
// most one blank line in a row and trims blank lines at both ends.
func tidyLines(out []byte) string {
	text := string(out)
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	var builder strings.Builder
	builder.Grow(len(text))
	blankRun := 0
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimRightFunc(line, unicode.IsSpace)
		if line == "" {
			blankRun++
			continue
		}
		if builder.Len() > 0 {
			builder.WriteString("\n")
			if blankRun > 0 {
				builder.WriteString("\n")
			}
		}
		blankRun = 0
		builder.WriteString(line)
	}
	return builder.String()
}

// collapseWhitespace trims s and turns every whitespace run into one space.
func collapseWhitespace(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

package builtintools

import (
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/html"
)

func TestExtractHTML(t *testing.T) {
	base, err := url.Parse("https://example.com/dir/index.html")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		html         string
		wantMarkdown string
		wantText     string
	}{
		{
			name:         "headings and paragraphs",
			html:         "<h1>Title</h1><p>First   para\n graph.</p><h3>Sub</h3><p>Second.</p>",
			wantMarkdown: "# Title\n\nFirst para graph.\n\n### Sub\n\nSecond.",
			wantText:     "Title\n\nFirst para graph.\n\nSub\n\nSecond.",
		},
		{
			name:         "links resolved, dead links dropped",
			html:         `<p><a href="a/b.html">rel</a> <a href="/abs">abs</a> <a href="https://other.org/x">ext</a> <a href="#frag">frag</a> <a href="javascript:void(0)">js</a> <a href="/empty"> </a>end</p>`,
			wantMarkdown: "[rel](https://example.com/dir/a/b.html) [abs](https://example.com/abs) [ext](https://other.org/x) frag js end",
			wantText:     "rel abs ext frag js end",
		},
		{
			name:         "emphasis and inline code",
			html:         "<p>a <b>bold</b>, <strong> strong </strong>, <i>it</i>, <code>x()</code> and <b></b>empty</p>",
			wantMarkdown: "a **bold**, **strong** , *it*, `x()` and empty",
			wantText:     "a bold, strong , it, x() and empty",
		},
		{
			name:         "nested and ordered lists",
			html:         `<ul><li>one</li><li>two<ul><li>two.a</li></ul></li></ul><ol start="7"><li>seven</li><li>eight</li></ol>`,
			wantMarkdown: "- one\n- two\n  - two.a\n\n7. seven\n8. eight",
			wantText:     "- one\n- two\n  - two.a\n\n7. seven\n8. eight",
		},
		{
			name:         "pre keeps whitespace and is fenced",
			html:         "<p>before</p><pre>\nline 1\n    <b>indented</b>  x\n</pre><p>after</p>",
			wantMarkdown: "before\n\n```\nline 1\n    indented  x\n```\n\nafter",
			wantText:     "before\n\nline 1\n    indented  x\n\nafter",
		},
		{
			name:         "blockquote",
			html:         "<p>intro</p><blockquote><p>one</p><p>two</p></blockquote><p>outro</p>",
			wantMarkdown: "intro\n\n> one\n>\n> two\n\noutro",
			wantText:     "intro\n\none\n\ntwo\n\noutro",
		},
		{
			name:         "invisible elements dropped",
			html:         "<head><title>T</title><style>p{}</style><script>var secret = 1</script></head><body>shown<script>alert('x')</script><noscript>no js</noscript><svg><svg></svg><text>vector</text></svg><template><p>tmpl</p></template> text</body>",
			wantMarkdown: "shown text",
			wantText:     "shown text",
		},
		{
			name:         "entities and whitespace",
			html:         "<p>&lt;tag&gt; &amp;&nbsp;&copy;\t\n  end</p>",
			wantMarkdown: "<tag> & © end",
			wantText:     "<tag> & © end",
		},
		{
			name:         "line breaks, rules, images, tables",
			html:         `<p>a<br>b<br><br>c</p><hr><img src="x.png" alt=" A  cat "><img src="y.png"><table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table>`,
			wantMarkdown: "a\nb\n\nc\n\n---\n\n[image: A cat]\n\nk | v\n1 | 2",
			wantText:     "a\nb\n\nc\n\n[image: A cat]\n\nk | v\n1 | 2",
		},
		{
			name: "unclosed and stray tags",
			html: "<p>one<p>two</b></i></ul></blockquote><li>item<div><b>open bold",
			// The stray <li> has no list, so no indentation for what follows.
			wantMarkdown: "one\n\ntwo\n\n- item\n**open bold**",
			wantText:     "one\n\ntwo\n\n- item\nopen bold",
		},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			if got := extractHTML([]byte(test.html), extractMarkdown, base).text; got != test.wantMarkdown {
				t.Errorf("markdown:\n got %q\nwant %q", got, test.wantMarkdown)
			}
			if got := extractHTML([]byte(test.html), extractPlainText, base).text; got != test.wantText {
				t.Errorf("text:\n got %q\nwant %q", got, test.wantText)
			}
		})
	}
}

func TestExtractHTMLTitle(t *testing.T) {
	page := extractHTML([]byte("<html><head><title>  A &amp; B\n title </title></head><body><svg><title>icon</title></svg>x</body></html>"), extractMarkdown, nil)
	if page.title != "A & B title" {
		t.Errorf("title = %q", page.title)
	}
	if page.text != "x" {
		t.Errorf("text = %q", page.text)
	}
}

func TestExtractHTMLBoundsOutput(t *testing.T) {
	// Short relative links against a long base would expand the output many
	// times over without the bound.
	base, err := url.Parse("https://example.com/" + strings.Repeat("long-path-segment/", 50))
	if err != nil {
		t.Fatal(err)
	}
	source := []byte(strings.Repeat(`<a href="x">y</a>`, 2000))
	page := extractHTML(source, extractMarkdown, base)
	if !page.truncated {
		t.Error("expected the output bound to be reached")
	}
	if len(page.text) > 2*len(source)+4096 {
		t.Errorf("output is %d bytes for %d bytes of input", len(page.text), len(source))
	}
}

func TestExtractHTMLDeepNesting(t *testing.T) {
	// The tokenizer-based renderer does no recursion; deep nesting is linear.
	source := strings.Repeat("<div><b><i>", 100000) + "deep" + strings.Repeat("</i></b></div>", 100000)
	page := extractHTML([]byte(source), extractPlainText, nil)
	if page.text != "deep" {
		t.Errorf("text = %.80q", page.text)
	}
}

// FuzzExtractHTML checks that extraction never panics and always yields
// tidy, valid UTF-8 with no text from script or style elements.
func FuzzExtractHTML(f *testing.F) {
	seeds := []string{
		"",
		"<p>hello <b>world</b></p>",
		`<a href="/x">link</a><a href="javascript:1">js</a>`,
		"<ul><li>a<ol><li>b</ol></ul>",
		"<pre>\n  code\n</pre>",
		"<blockquote><blockquote>deep</blockquote></blockquote>",
		"<script>SCRIPTTEXT</script><style>STYLETEXT</style>",
		"<svg><script>x</script></svg>after",
		"<b><i></b></i>",
		"<table><tr><td>1<td>2</table>",
		"\xff\xfe<p>\x00bad utf8</p>",
		"<title>t</title><h1></h1><h2>x",
		"<plaintext><b>raw",
		"&lt;&#x1F600;&bogus;",
	}
	for _, seed := range seeds {
		f.Add(seed, true)
	}
	base, _ := url.Parse("https://example.com/a/b")
	f.Fuzz(func(t *testing.T, source string, markdown bool) {
		mode := extractPlainText
		if markdown {
			mode = extractMarkdown
		}
		page := extractHTML([]byte(source), mode, base)
		if !utf8.ValidString(page.text) || !utf8.ValidString(page.title) {
			t.Fatalf("invalid UTF-8 output for %q", source)
		}
		if strings.Contains(page.text, "\n\n\n") {
			t.Fatalf("more than one blank line in a row for %q: %q", source, page.text)
		}
		if strings.HasPrefix(page.text, "\n") || strings.TrimRightFunc(page.text, unicode.IsSpace) != page.text {
			t.Fatalf("untrimmed output for %q: %q", source, page.text)
		}
		for line := range strings.SplitSeq(page.text, "\n") {
			if strings.TrimRight(line, " \t") != line {
				t.Fatalf("trailing whitespace for %q: %q", source, line)
			}
		}
		if len(page.text) > 2*len(source)+4096 {
			t.Fatalf("output %d bytes for %d bytes of input", len(page.text), len(source))
		}
		// Text that only ever appears inside a script element never leaks.
		if !onlyInsideScript(source, "SCRIPTTEXT") {
			return
		}
		if strings.Contains(page.text, "SCRIPTTEXT") {
			t.Fatalf("script text leaked for %q: %q", source, page.text)
		}
	})
}

// onlyInsideScript reports whether marker occurs in source and, as the
// HTML tokenizer reads it, only as the raw text of a script element.
// Looking at the bytes is not enough: "<A<script>" is one tag named
// "a<script", so the text after it is ordinary text.
func onlyInsideScript(source, marker string) bool {
	tokenizer := html.NewTokenizer(strings.NewReader(source))
	found, afterScriptStart := false, false
	for {
		tokenType := tokenizer.Next()
		if tokenType == html.ErrorToken {
			return found
		}
		if tokenType == html.TextToken && afterScriptStart {
			found = found || strings.Contains(string(tokenizer.Text()), marker)
			afterScriptStart = false
			continue
		}
		raw := string(tokenizer.Raw())
		var text string
		if tokenType == html.TextToken {
			text = string(tokenizer.Text()) // entities decoded: "&#83;CRIPTTEXT"
		}
		name, hasAttributes := tokenizer.TagName()
		for hasAttributes { // values are entity-decoded too
			var value []byte
			_, value, hasAttributes = tokenizer.TagAttr()
			text += string(value)
		}
		if strings.Contains(raw, marker) || strings.Contains(text, marker) {
			return false
		}
		afterScriptStart = tokenType == html.StartTagToken && string(name) == "script"
	}
}

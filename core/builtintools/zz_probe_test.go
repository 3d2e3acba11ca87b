package builtintools

import (
	"fmt"
	"net/url"
	"testing"
)

func TestZZProbe(t *testing.T) {
	src := `<!DOCTYPE html><html><head><title> My  Page </title><style>body{color:red}</style><script>var secret=1;</script></head>
<body>
<nav><a href="/">Home</a> | <a href="#top">Top</a> <a href="javascript:alert(1)">JS</a></nav>
<h1>Main   heading</h1>
<p>Some <b>bold</b> and <em> italic </em> text with a <a href="docs/page.html">relative link</a>
and <code>inline()</code> code.&nbsp;Entities: &lt;tag&gt; &amp; &copy;</p>
<ul><li>one</li><li>two<ul><li>nested a</li><li>nested b</li></ul></li><li>three</li></ul>
<ol start="3"><li>third</li><li>fourth</li></ol>
<pre><code>func main() {
    fmt.Println("hi")
}
</code></pre>
<blockquote><p>Quoted para one.</p><p>Quoted two.</p></blockquote>
<noscript>enable js</noscript><svg><text>svg text</text></svg><template><p>tmpl</p></template>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>a</td><td>1</td></tr></table>
<p>Line one<br>Line two</p><hr><img src="x.png" alt="A cat"><a href="/empty"></a><b> </b>
<h2>Second</h2><div>div text</div><div>another</div>
</body></html>`
	base, _ := url.Parse("https://example.com/dir/index.html")
	p := extractHTML([]byte(src), extractMarkdown, base)
	fmt.Printf("TITLE=%q\n---\n%s\n---\n", p.title, p.text)
	p = extractHTML([]byte(src), extractPlainText, base)
	fmt.Printf("---\n%s\n---\n", p.text)
}

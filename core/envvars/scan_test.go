package envvars

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const importPath = "github.com/capsem/capsem/core/envvars"

// productDirs hold the program's code; testdata/ (tools such as
// benchreport) and _test.go files are not the program and may name
// variables as they like.
var productDirs = []string{"core", "personalities", "vmm", "guestfs", "main.go"}

// notVariables are CAPSEM_ words in the code that name no variable.
var notVariables = map[string]string{
	"CAPSEM_META": "the relay's metadata line (core/mcpframe.MetaPrefix)",
}

var (
	// variableWord is a CAPSEM_ name within text ("set CAPSEM_RUN_DIR to").
	variableWord = regexp.MustCompile(`\bCAPSEM_[A-Z0-9_]*[A-Z0-9]\b`)
	// nameInCode is a literal that is a name, or a NAME=value entry: code
	// that reads or sets the variable, which must go through its handle.
	nameInCode = regexp.MustCompile(`^CAPSEM_[A-Z0-9_]*[A-Z0-9](=\S*)?$`)
)

// scan is what the product's source says about CAPSEM_ variables.
type scan struct {
	problems []string        // file:line: what is wrong
	used     map[string]bool // handles referenced (envvars.Home) outside this package
	kong     map[string]bool // names in env:"..." struct tags
}

// scanFile records one non-test file of the product; inRegistry is true
// for this package's own files, which declare the names.
func (s *scan) scanFile(fset *token.FileSet, f *ast.File, inRegistry bool) {
	local := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == importPath {
			local = "envvars"
			if imp.Name != nil {
				local = imp.Name.Name
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && local != "" && id.Name == local {
				s.used[n.Sel.Name] = true
			}
		case *ast.Field:
			if n.Tag != nil {
				tag, _ := strconv.Unquote(n.Tag.Value)
				for name := range strings.SplitSeq(reflect.StructTag(tag).Get("env"), ",") {
					if name != "" {
						s.kong[name] = true
					}
				}
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			at := fset.Position(n.Pos())
			for _, word := range variableWord.FindAllString(text, -1) {
				if _, ok := notVariables[word]; !ok && Find(word) == nil {
					s.problems = append(s.problems, fmt.Sprintf("%s:%d: %s is not declared in core/envvars (declared.go)", at.Filename, at.Line, word))
				}
			}
			if !inRegistry && nameInCode.MatchString(text) {
				s.problems = append(s.problems, fmt.Sprintf("%s:%d: %q names a variable in code: use its envvars handle (Get, Value, Pair, Name)", at.Filename, at.Line, text))
			}
		}
		return true
	})
}

// handles maps each handle this package declares (Home) to its variable's
// name (CAPSEM_HOME), from the declarations' source.
func handles(t *testing.T, fset *token.FileSet, files []*ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					call, ok := v.(*ast.CallExpr)
					if !ok || !isIdent(call.Fun, "declare") {
						continue
					}
					ast.Inspect(call, func(n ast.Node) bool {
						if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							if text, _ := strconv.Unquote(lit.Value); strings.HasPrefix(text, "CAPSEM_") && out[vs.Names[i].Name] == "" {
								out[vs.Names[i].Name] = text
							}
						}
						return true
					})
				}
			}
		}
	}
	return out
}

func isIdent(e ast.Expr, name string) bool {
	if ix, ok := e.(*ast.IndexExpr); ok { // declare[T](...)
		e = ix.X
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// moduleRoot is the directory of go.mod above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// productFiles parses the product's non-test Go files, every build tag
// included (the guest build's grammar is a file of its own).
func productFiles(t *testing.T, root string) (fset *token.FileSet, product, registry []*ast.File) {
	t.Helper()
	fset = token.NewFileSet()
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, top := range productDirs {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if filepath.Dir(p) == self {
				registry = append(registry, f)
			} else {
				product = append(product, f)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(product) < 100 || len(registry) == 0 {
		t.Fatalf("found %d product files and %d of the registry under %s: not the repository", len(product), len(registry), root)
	}
	return fset, product, registry
}

// check scans the files and reports every problem: undeclared names,
// names used as code outside the registry, declarations nothing reads,
// and handles the source and the registry disagree on.
func check(t *testing.T, fset *token.FileSet, product, registry []*ast.File) []string {
	s := &scan{used: map[string]bool{}, kong: map[string]bool{}}
	for _, f := range registry {
		s.scanFile(fset, f, true)
	}
	for _, f := range product {
		s.scanFile(fset, f, false)
	}
	declared := handles(t, fset, registry)
	problems := s.problems
	var names []string
	for handle, name := range declared {
		names = append(names, name)
		if Find(name) == nil {
			problems = append(problems, fmt.Sprintf("envvars.%s (%s) is not in the registry (the list at the end of declared.go)", handle, name))
		}
		if !s.used[handle] && !s.kong[name] {
			problems = append(problems, fmt.Sprintf("envvars.%s (%s) is declared but nothing in the product reads it: remove it", handle, name))
		}
	}
	for _, v := range All() {
		if !slices.Contains(names, v.Name()) {
			problems = append(problems, fmt.Sprintf("%s is in the registry without a handle of its own in declared.go", v.Name()))
		}
	}
	slices.Sort(problems)
	return problems
}

// TestRepositoryNamesOnlyDeclaredVariables scans the product's source:
// every CAPSEM_ name in a string literal (kong's env tags and help texts
// included) is declared, no code outside the registry names one itself,
// and every declaration is read somewhere.
func TestRepositoryNamesOnlyDeclaredVariables(t *testing.T) {
	fset, product, registry := productFiles(t, moduleRoot(t))
	for _, p := range check(t, fset, product, registry) {
		t.Error(p)
	}
}

// TestScanFindsProblems: the scan fails on each kind of problem, naming
// the file and line.
func TestScanFindsProblems(t *testing.T) {
	const src = `package p

import ev "github.com/capsem/capsem/core/envvars"

type Cmd struct {
	Flag bool ` + "`env:\"CAPSEM_NO_SUCH_FLAG\"`" + `
	Level string ` + "`env:\"CAPSEM_LOG_LEVEL\"`" + `
}

var a = os.Getenv("CAPSEM_HOME")
var b = "CAPSEM_RUN_DIR=" + dir
var c = "set CAPSEM_TYPO to a directory"
var d = "set CAPSEM_RUN_DIR to a directory"
var e = ev.CacheDir.Get()
var f = "\x00CAPSEM_META:"
var g = "CAPSEM_MCP_*"
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	// A registry of two handles, one of them read by no one.
	reg, err := parser.ParseFile(fset, "declared.go", `package envvars
var (
	CacheDir = declare(filePath, about{name: "CAPSEM_CACHE_DIR"})
	Home = declare(filePath, about{name: "CAPSEM_HOME"})
	LogLevel = declare[string](level, about{name: "CAPSEM_LOG_LEVEL"})
)`, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	got := check(t, fset, []*ast.File{f}, []*ast.File{reg})
	want := []string{
		`envvars.Home (CAPSEM_HOME) is declared but nothing in the product reads it: remove it`,
		`p.go:10: "CAPSEM_HOME" names a variable in code: use its envvars handle (Get, Value, Pair, Name)`,
		`p.go:11: "CAPSEM_RUN_DIR=" names a variable in code: use its envvars handle (Get, Value, Pair, Name)`,
		`p.go:12: CAPSEM_TYPO is not declared in core/envvars (declared.go)`,
		`p.go:6: CAPSEM_NO_SUCH_FLAG is not declared in core/envvars (declared.go)`,
	}
	// The registry in force has more than this one's three handles.
	got = slices.DeleteFunc(got, func(p string) bool { return strings.HasSuffix(p, "without a handle of its own in declared.go") })
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

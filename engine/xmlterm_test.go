package engine

import (
	"math/rand/v2"
	"os"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The scanner for libvirt's plain XML and encoding/xml must give the same tree for every
// document the scanner reads, and the scanner must leave every other document to encoding/xml.
func TestXMLTermScannerAgreesWithEncodingXML(t *testing.T) {
	recorded, err := os.ReadFile("testdata/vmdefaults-domain.xml")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]struct {
		doc     string
		scanned bool // the scanner reads it itself
	}{
		"libvirt's answer": {string(recorded), true},
		"declaration, entities, character references, both quotes": {`<?xml version="1.0"?>
<domain type="kvm"><name>a&amp;b &lt;c&gt; &apos;d&quot; &#65;&#x42;</name><x a='1 &amp; 2' b="&quot;q&quot;"/>
  <x a='2'/><y>  text  <z/> more </y></domain>
`, true},
		"namespaced metadata": {`<domain><metadata><ns:app xmlns:ns="http://example.com/x"><ns:k v='1'/></ns:app></metadata></domain>`, true},
		"a comment":           {`<domain><!-- c --><name>x</name></domain>`, false},
		"CDATA":               {`<domain><name><![CDATA[<x>]]></name></domain>`, false},
		"a carriage return":   {"<domain>\r\n<name>x</name></domain>", false},
		"non-ASCII":           {`<domain><name>é</name></domain>`, false},
		"a control reference": {`<domain><name>&#9;x</name></domain>`, false},
	}
	for name, tc := range docs {
		t.Run(name, func(t *testing.T) {
			scanned, ok := scanXMLTerm([]byte(tc.doc))
			if ok != tc.scanned {
				t.Fatalf("scanner read it: %v, want %v", ok, tc.scanned)
			}
			want, err := decodeXMLTerm([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			got, err := xmlTerm([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(want) {
				t.Errorf("xmlTerm\n%v\nencoding/xml\n%v", got, want)
			}
			if ok && !scanned.Equal(want) {
				t.Errorf("scanner\n%v\nencoding/xml\n%v", scanned, want)
			}
		})
	}
	// Damaged documents: whatever the scanner reads, encoding/xml reads alike.
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("<>/='\"&;# \nax:!?-")
	read := 0
	for range 5000 {
		doc := []byte(string(recorded))
		for range 1 + rng.IntN(3) {
			at := rng.IntN(len(doc))
			switch rng.IntN(3) {
			case 0:
				doc = append(doc[:at], doc[at+1:]...)
			case 1:
				doc[at] = alphabet[rng.IntN(len(alphabet))]
			default:
				doc = append(doc[:at], append([]byte{alphabet[rng.IntN(len(alphabet))]}, doc[at:]...)...)
			}
		}
		scanned, ok := scanXMLTerm(doc)
		if !ok {
			continue
		}
		read++
		want, err := decodeXMLTerm(doc)
		if err != nil {
			t.Fatalf("the scanner read a document encoding/xml refuses (%v):\n%s", err, doc)
		}
		if !scanned.Equal(want) {
			t.Fatalf("trees differ for\n%s\nscanner %v\nencoding/xml %v", doc, scanned, want)
		}
	}
	if read == 0 {
		t.Error("the scanner read no damaged document: the comparison proved nothing")
	}
}

func BenchmarkXMLTerm(b *testing.B) {
	doc, err := os.ReadFile("testdata/vmdefaults-domain.xml")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("scanner", func(b *testing.B) {
		for b.Loop() {
			if _, ok := scanXMLTerm(doc); !ok {
				b.Fatal("not scanned")
			}
		}
	})
	b.Run("encoding-xml", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeXMLTerm(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// vmDefaultsOf reads the mapping's answer as the JSON round trip it replaces did.
func TestVMDefaultsOfAgreesWithJSON(t *testing.T) {
	answer := ast.MustParseTerm(`[
		{"path": ["domain", "cpu", "sockets"], "value": 2},
		{"path": ["domain", "devices", "interfaces", 10, "macAddress"], "value": "02:00:00:00:00:01"},
		{"path": ["a", 0, "b"], "value": {"x": [1.5, true, null, "s", 1e3, {"y": {}}], "z": []}},
		{"path": ["s"], "value": {"b", "a"}}
	]`)
	got, err := vmDefaultsOf(answer)
	if err != nil {
		t.Fatal(err)
	}
	var want []VMDefault
	if err := decode(answer, &want); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		for j, p := range want[i].Path {
			if f, ok := p.(float64); ok {
				want[i].Path[j] = int(f)
			}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v\nwant %#v", got, want)
	}
	for _, bad := range []string{`{}`, `[1]`, `[{"path": "x", "value": 1}]`, `[{"path": [true], "value": 1}]`, `[{"path": [1.5], "value": 1}]`, `[{"path": ["x"]}]`} {
		if _, err := vmDefaultsOf(ast.MustParseTerm(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

package match

import (
	"regexp"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB matches $regex with PCRE; the proxy translates the pattern to
// Go's RE2 syntax where the two agree, and refuses by name what RE2 cannot
// do (backreferences, lookaround, possessive quantifiers, \Z, ...) rather
// than match differently. The translation:
//
//   - options i, m, s become RE2 flags; x strips whitespace and #-comments
//     outside classes, as PCRE's extended mode does; u is accepted (MongoDB
//     always matches UTF-8); another letter is MongoDB's error 51108.
//   - \s, \S, \v and \h take PCRE's meaning (\s includes \v, the vertical
//     tab; \v is PCRE's vertical-space class, not RE2's vertical tab).
//   - $ without the m option also matches before a final newline, as in
//     PCRE; where it is followed by more of the pattern than the end of a
//     group or an alternative, the pattern is refused.
//
// A regex matches strings and symbols; a field holding a regex value
// matches when pattern and options are the same.

// regexFlagCode is MongoDB's code for an unknown option letter.
const regexFlagCode mongoerr.Code = 51108

// regexOperator compiles {$regex: re, $options: opts}.
func (fc *Compiler) regexOperator(field string, re bsoncore.Value, options *bsoncore.Value) (matcher, error) {
	opts := ""
	if options != nil {
		s, ok := options.StringValueOK()
		if !ok || options.Type != bsoncore.TypeString {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "$options has to be a string")
		}
		opts = s
	}
	switch re.Type {
	case bsoncore.TypeString:
		pattern, _ := re.StringValueOK()
		if strings.IndexByte(pattern, 0) >= 0 {
			return nil, mongoerr.Errorf(mongoerr.Code(51091), "Regular expression cannot contain an embedded null byte")
		}
		return fc.regexLeaf(field, pattern, opts)
	case bsoncore.TypeRegex:
		pattern, flags, ok := re.RegexOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.BadValue, "$regex is not valid BSON")
		}
		if flags != "" && opts != "" {
			return nil, mongoerr.Errorf(mongoerr.Code(51075), "options set in both $regex and $options")
		}
		if flags == "" {
			flags = opts
		}
		return fc.regexLeaf(field, pattern, flags)
	}
	return nil, mongoerr.Errorf(mongoerr.BadValue, "$regex has to be a string")
}

// regexValue compiles a regex value to a leaf matcher.
func (fc *Compiler) regexValue(field string, re bsoncore.Value) (matcher, error) {
	p, err := fc.compileRegex(field, re)
	if err != nil {
		return nil, err
	}
	return leaf(p), nil
}

func (fc *Compiler) regexLeaf(field, pattern, flags string) (matcher, error) {
	p, err := fc.regexPred(field, pattern, flags)
	if err != nil {
		return nil, err
	}
	return leaf(p), nil
}

// compileRegex compiles a regex value to its test of one value.
func (fc *Compiler) compileRegex(field string, re bsoncore.Value) (valuePred, error) {
	pattern, flags, ok := re.RegexOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "regular expression is not valid BSON")
	}
	return fc.regexPred(field, pattern, flags)
}

// regexPred is the test of one value by a pattern with options.
func (fc *Compiler) regexPred(field, pattern, flags string) (valuePred, error) {
	goPattern, err := translateRegex(pattern, flags)
	if err != nil {
		return nil, err
	}
	if goPattern == "" {
		return nil, fc.Unsupported("regular expression /%s/%s (on %q) is not supported: %s", pattern, flags, field, unsupportedRegexWhy)
	}
	rx, cerr := regexp.Compile(goPattern)
	if cerr != nil {
		return nil, fc.Unsupported("regular expression /%s/%s (on %q) is not supported: Go's RE2 cannot compile it (%v); backreferences, lookaround, possessive quantifiers and some escapes have no RE2 equivalent", pattern, flags, field, cerr)
	}
	return func(v bsoncore.Value) bool {
		switch v.Type {
		case bsoncore.TypeString, bsoncore.TypeSymbol:
			s, _, ok := bsoncore.ReadString(v.Data)
			return ok && rx.MatchString(s)
		case bsoncore.TypeRegex:
			p, f, ok := v.RegexOK()
			return ok && p == pattern && f == flags
		}
		return false
	}, nil
}

// unsupportedRegexWhy is why translateRegex gave up (set with "" result).
const unsupportedRegexWhy = "$ (end of string) followed by more of the pattern, or an inline (?m) option, matches differently in PCRE and Go's RE2"

// translateRegex rewrites a PCRE pattern with MongoDB options as RE2
// syntax; "" (and no error) when the pattern cannot be rewritten exactly.
func translateRegex(pattern, flags string) (string, error) {
	var multiline, extended bool
	goFlags := ""
	for _, c := range flags {
		switch c {
		case 'i', 's':
			if !strings.ContainsRune(goFlags, c) {
				goFlags += string(c)
			}
		case 'm':
			multiline = true
			if !strings.ContainsRune(goFlags, c) {
				goFlags += string(c)
			}
		case 'x':
			extended = true
		case 'u':
		default:
			return "", mongoerr.Errorf(regexFlagCode, "invalid flag in regex options: %c", c)
		}
	}
	var out strings.Builder
	if goFlags != "" {
		out.WriteString("(?" + goFlags + ")")
	}
	p := pattern
	inClass := false
	for i := 0; i < len(p); {
		c := p[i]
		if c == '\\' {
			if i+1 >= len(p) {
				out.WriteByte(c) // RE2 refuses the trailing backslash
				i++
				continue
			}
			n := p[i+1]
			switch {
			case n == 'Q':
				// Literal up to \E: copied as it is (RE2 knows \Q...\E).
				end := strings.Index(p[i+2:], `\E`)
				if end < 0 {
					out.WriteString(p[i:])
					i = len(p)
				} else {
					out.WriteString(p[i : i+2+end+2])
					i += 2 + end + 2
				}
				continue
			case n == 's' && inClass:
				out.WriteString(`\t\n\x0B\f\r `)
			case n == 's':
				out.WriteString(`[\t\n\x0B\f\r ]`)
			case n == 'S' && inClass:
				out.WriteString(`\x00-\x08\x0E-\x1F\x21-\x{10FFFF}`)
			case n == 'S':
				out.WriteString(`[^\t\n\x0B\f\r ]`)
			case n == 'v' && inClass:
				out.WriteString(`\n\x0B\f\r\x{85}\x{2028}\x{2029}`)
			case n == 'v':
				out.WriteString(`[\n\x0B\f\r\x{85}\x{2028}\x{2029}]`)
			case n == 'h' && inClass:
				out.WriteString(`\t \x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}`)
			case n == 'h':
				out.WriteString(`[\t \x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}]`)
			default:
				out.WriteString(p[i : i+2])
			}
			i += 2
			continue
		}
		if inClass {
			switch {
			case c == '[' && i+1 < len(p) && p[i+1] == ':':
				// A POSIX class [:alpha:]: copied whole.
				if end := strings.Index(p[i+2:], ":]"); end >= 0 {
					out.WriteString(p[i : i+2+end+2])
					i += 2 + end + 2
					continue
				}
			case c == ']':
				inClass = false
			}
			out.WriteByte(c)
			i++
			continue
		}
		switch c {
		case '[':
			inClass = true
			out.WriteByte(c)
			i++
			if i < len(p) && p[i] == '^' {
				out.WriteByte('^')
				i++
			}
			if i < len(p) && p[i] == ']' { // a leading ] is literal
				out.WriteByte(']')
				i++
			}
			continue
		case ' ', '\t', '\n', '\r', '\f', '\v':
			if extended {
				i++
				continue
			}
		case '#':
			if extended {
				if nl := strings.IndexByte(p[i:], '\n'); nl >= 0 {
					i += nl + 1
				} else {
					i = len(p)
				}
				continue
			}
		case '(':
			// An inline option group that turns m on or off changes what
			// $ means from there: not followed.
			if strings.HasPrefix(p[i:], "(?") {
				j := i + 2
				for j < len(p) && (p[j] >= 'a' && p[j] <= 'z' || p[j] >= 'A' && p[j] <= 'Z' || p[j] == '-') {
					j++
				}
				if strings.ContainsAny(p[i+2:j], "m") && j < len(p) && (p[j] == ':' || p[j] == ')') && strings.Contains(p, "$") {
					return "", nil
				}
			}
		case '$':
			if !multiline {
				if !endsGroup(p[i+1:], extended) {
					return "", nil
				}
				out.WriteString(`(?:\n?\z)`)
				i++
				continue
			}
		}
		out.WriteByte(c)
		i++
	}
	return out.String(), nil
}

// endsGroup reports whether nothing that follows a $ (rest) can consume
// a character in the same branch: only the ends of groups (with their
// quantifiers), other alternatives, and what the x option ignores.
func endsGroup(rest string, extended bool) bool {
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; {
		case extended && (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'):
		case extended && c == '#':
			nl := strings.IndexByte(rest[i:], '\n')
			if nl < 0 {
				return true
			}
			i += nl
		case c == ')' || c == '*' || c == '+' || c == '?':
		case c == '{':
			j := i + 1
			for j < len(rest) && (rest[j] >= '0' && rest[j] <= '9' || rest[j] == ',') {
				j++
			}
			if j >= len(rest) || rest[j] != '}' {
				return false
			}
			i = j
		case c == '|':
			// Another alternative: skip to the end of the enclosing group.
			end, ok := skipAlternatives(rest[i+1:])
			if !ok {
				return true
			}
			i += end // at the closing parenthesis, consumed next turn
		default:
			return false
		}
	}
	return true
}

// skipAlternatives returns the offset in s of the parenthesis closing the
// current group (false: none, the alternatives run to the end).
func skipAlternatives(s string) (int, bool) {
	depth, inClass := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
			if i+1 < len(s) && s[i+1] == '^' {
				i++
			}
			if i+1 < len(s) && s[i+1] == ']' {
				i++
			}
		case c == '(':
			depth++
		case c == ')':
			if depth == 0 {
				return i, true
			}
			depth--
		}
	}
	return 0, false
}

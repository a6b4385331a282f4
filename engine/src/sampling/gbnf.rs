//! llama.cpp's GBNF grammars (llama-server's `grammar` field, the EBNF that vLLM's
//! `structured_outputs.grammar` takes), translated into llguidance's Lark dialect so that one
//! constraint engine serves both.
//!
//! GBNF: rules `name ::= alternatives`, one per line (a rule continues past a line end after
//! `::=`, after `|` and inside parentheses); string literals `"…"` and character classes `[…]`
//! / `[^…]` with the escapes `\t \n \r \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`; `.` for any
//! character; grouping; the postfix operators `* + ?` and `{m}`, `{m,}`, `{m,n}`, `{,n}`;
//! `#` comments; token references `<[id]>` / `<name>`; `root` is where the text starts.
//! A line that starts with `|` continues the rule above it.
//!
//! The translation is one Lark rule per GBNF rule: literals become Lark strings, classes and
//! `.` become one-character regular expressions, repetitions keep their bounds. llguidance
//! splits text into lexemes greedily (longest match, one character of look-ahead), so a
//! grammar that needs a longer look-ahead to choose between two literals can refuse a text
//! llama.cpp's backtracking matcher would take (see docs/serving.md).

use std::collections::HashMap;

/// A GBNF grammar that cannot be translated: where and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("GBNF grammar, line {line}: {msg}")]
pub struct GbnfError {
    /// The 1-based line of the grammar text.
    pub line: usize,
    /// What is wrong there.
    pub msg: String,
}

/// Whether `text` reads as GBNF rather than Lark: its first rule is written `name ::= …`.
pub fn is_gbnf(text: &str) -> bool {
    let Some(first) = text
        .lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("//"))
    else {
        return false;
    };
    let rest = first.trim_start_matches(is_word_char);
    rest.len() < first.len() && rest.trim_start().starts_with("::=")
}

/// The Lark grammar equivalent to `gbnf` (its start rule derives `root`).
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let mut p = Parser { src: gbnf.chars().collect(), pos: 0, names: Names::default() };
    let rules = p.grammar()?;
    let mut defined: HashMap<&str, usize> = HashMap::new();
    for (i, (name, _, _)) in rules.iter().enumerate() {
        if defined.insert(name.as_str(), i).is_some() {
            return Err(p.error_at(rules[i].1, format!("rule '{name}' is defined twice")));
        }
    }
    if !defined.contains_key("root") {
        return Err(GbnfError { line: 1, msg: "the grammar has no 'root' rule".into() });
    }
    if let Some((name, at)) = p.names.used.iter().find(|(n, _)| !defined.contains_key(n.as_str())) {
        return Err(p.error_at(*at, format!("rule '{name}' is used but never defined")));
    }
    let mut out = format!("start: {}\n", p.names.lark("root"));
    for (name, _, body) in &rules {
        out.push_str(&format!("{}: {}\n", p.names.lark(name), body));
    }
    Ok(out)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// GBNF rule names and their Lark spellings (lower case, `[a-z][a-z0-9_]*`, never `start`,
/// distinct for distinct GBNF names).
#[derive(Default)]
struct Names {
    lark: HashMap<String, String>,
    taken: std::collections::HashSet<String>,
    /// Every name referenced, with the position of its first use.
    used: Vec<(String, usize)>,
}

impl Names {
    fn lark(&mut self, gbnf: &str) -> String {
        if let Some(l) = self.lark.get(gbnf) {
            return l.clone();
        }
        let mut base: String = gbnf
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .collect();
        if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
            base.insert_str(0, "r_");
        }
        let mut name = base.clone();
        let mut n = 1;
        while name == "start" || self.taken.contains(&name) {
            n += 1;
            name = format!("{base}_{n}");
        }
        self.taken.insert(name.clone());
        self.lark.insert(gbnf.to_string(), name.clone());
        name
    }

    fn use_name(&mut self, gbnf: &str, at: usize) -> String {
        if !self.used.iter().any(|(n, _)| n == gbnf) {
            self.used.push((gbnf.to_string(), at));
        }
        self.lark(gbnf)
    }
}

/// One item of a sequence in Lark, and whether it already carries a postfix operator (a second
/// one needs parentheses).
struct Item {
    lark: String,
    has_op: bool,
}

struct Parser {
    src: Vec<char>,
    pos: usize,
    names: Names,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.src.get(self.pos + k).copied()
    }

    fn error_at(&self, pos: usize, msg: String) -> GbnfError {
        let line = 1 + self.src[..pos.min(self.src.len())].iter().filter(|&&c| c == '\n').count();
        GbnfError { line, msg }
    }

    fn error(&self, msg: impl Into<String>) -> GbnfError {
        self.error_at(self.pos, msg.into())
    }

    /// Skips blanks and comments, and line ends where `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                '\r' | '\n' if newline_ok => self.pos += 1,
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(match self.peek() {
                Some(c) => format!("expected a rule name, found '{c}'"),
                None => "expected a rule name".to_string(),
            }));
        }
        Ok(self.src[start..self.pos].iter().collect())
    }

    /// Every rule: (GBNF name, position, Lark body).
    fn grammar(&mut self) -> Result<Vec<(String, usize, String)>, GbnfError> {
        let mut rules = Vec::new();
        self.space(true);
        while self.peek().is_some() {
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !self.src[self.pos..].starts_with(&[':', ':', '=']) {
                return Err(self.error(format!("expected '::=' after '{name}'")));
            }
            self.pos += 3;
            self.space(true);
            let body = self.alternates(false)?;
            match self.peek() {
                None => {}
                Some('\n' | '\r') => self.pos += 1,
                Some(c) => {
                    return Err(self.error(format!("unexpected '{c}' (expected a line end)")))
                }
            }
            self.space(true);
            rules.push((name, at, body));
        }
        Ok(rules)
    }

    fn alternates(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            // A line that starts with `|` continues the rule (llama.cpp wants the bar before
            // the line end; both are taken here).
            let save = self.pos;
            self.space(true);
            if self.peek() != Some('|') {
                self.pos = save;
                break;
            }
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                '"' => Some(self.literal()?),
                '[' => Some(self.class()?),
                '.' => {
                    self.pos += 1;
                    Some("/(?s:.)/".to_string())
                }
                '(' => {
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternates(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.error("expected ')'"));
                    }
                    self.pos += 1;
                    Some(format!("({inner})"))
                }
                '<' => Some(self.token_ref()?),
                '!' => {
                    return Err(self.error("negated token references ('!<…>') are not supported"))
                }
                '*' | '+' | '?' => {
                    self.pos += 1;
                    self.postfix(&mut items, &c.to_string())?;
                    None
                }
                '{' => {
                    let op = self.repetition()?;
                    match op {
                        Some(op) => self.postfix(&mut items, &op)?,
                        None => {
                            // `{0}`: the item matches nothing.
                            if items.pop().is_none() {
                                return Err(self.error("a repetition must follow an item"));
                            }
                        }
                    }
                    None
                }
                c if is_word_char(c) => {
                    let at = self.pos;
                    let name = self.name()?;
                    Some(self.names.use_name(&name, at))
                }
                _ => break,
            };
            if let Some(lark) = item {
                items.push(Item { lark, has_op: false });
            }
            self.space(nested);
        }
        if items.is_empty() {
            return Ok("\"\"".to_string());
        }
        Ok(items.into_iter().map(|i| i.lark).collect::<Vec<_>>().join(" "))
    }

    fn postfix(&mut self, items: &mut [Item], op: &str) -> Result<(), GbnfError> {
        let Some(last) = items.last_mut() else {
            return Err(self.error(format!("'{op}' must follow an item")));
        };
        if last.has_op {
            last.lark = format!("({}){op}", last.lark);
        } else {
            last.lark.push_str(op);
            last.has_op = true;
        }
        Ok(())
    }

    /// `{m}`, `{m,}`, `{m,n}`, `{,n}` as Lark's bounds; `None` for a repetition of zero times.
    fn repetition(&mut self) -> Result<Option<String>, GbnfError> {
        self.pos += 1;
        self.space(false);
        let min = self.number()?;
        self.space(false);
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            self.space(false);
            self.number()?
        } else {
            Some(min.ok_or_else(|| self.error("expected a number in '{…}'"))?)
        };
        self.space(false);
        if self.peek() != Some('}') {
            return Err(self.error("expected '}'"));
        }
        self.pos += 1;
        let min = min.unwrap_or(0);
        Ok(match max {
            Some(0) => None,
            Some(max) if max < min => {
                return Err(self.error(format!(
                    "repetition {{{min},{max}}}: the maximum is below the minimum"
                )))
            }
            Some(max) if max == min => Some(format!("{{{min}}}")),
            Some(max) => Some(format!("{{{min},{max}}}")),
            None => Some(format!("{{{min},}}")),
        })
    }

    fn number(&mut self) -> Result<Option<u32>, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        let digits: String = self.src[start..self.pos].iter().collect();
        digits
            .parse::<u32>()
            .ok()
            .filter(|&n| n <= i32::MAX as u32)
            .map(Some)
            .ok_or_else(|| self.error_at(start, format!("repetition count {digits} is too large")))
    }

    /// One character of a literal or class, after its escapes.
    fn char(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.peek() else {
            return Err(self.error("unexpected end of the grammar"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return Err(self.error("unexpected end of the grammar after '\\'"));
        };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, GbnfError> {
            let digits: String = p.src.get(p.pos..p.pos + n).unwrap_or(&[]).iter().collect();
            let code = (digits.len() == n)
                .then(|| u32::from_str_radix(&digits, 16).ok())
                .flatten()
                .ok_or_else(|| p.error(format!("expected {n} hex digits after '\\{e}'")))?;
            p.pos += n;
            char::from_u32(code).ok_or_else(|| p.error(format!("\\{e}{digits} is not a character")))
        };
        Ok(match e {
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            '\\' | '"' | '[' | ']' | '-' | '^' => e,
            _ => return Err(self.error(format!("unknown escape '\\{e}'"))),
        })
    }

    fn literal(&mut self) -> Result<String, GbnfError> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return Err(self.error("unterminated string literal")),
                Some('"') => break,
                _ => text.push(self.char()?),
            }
        }
        self.pos += 1;
        Ok(lark_string(&text))
    }

    fn class(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut rx = String::from(if negated { "[^" } else { "[" });
        let mut empty = true;
        loop {
            match self.peek() {
                None | Some('\n') => {
                    return Err(self.error_at(start, "unterminated character class".into()))
                }
                Some(']') => break,
                _ => {}
            }
            let lo = self.char()?;
            rx.push_str(&rx_char(lo));
            if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']' && c != '\n') {
                self.pos += 1;
                let hi = self.char()?;
                if hi < lo {
                    return Err(self.error(format!("class range '{lo}-{hi}' is backwards")));
                }
                rx.push('-');
                rx.push_str(&rx_char(hi));
            }
            empty = false;
        }
        self.pos += 1;
        if empty {
            // `[^]` is any character; `[]` none, which no text can match.
            return if negated {
                Ok("/(?s:.)/".to_string())
            } else {
                Err(self.error_at(start, "empty character class".into()))
            };
        }
        rx.push(']');
        Ok(format!("/{rx}/"))
    }

    /// `<[123]>` or `<name>`: a special token, as Lark writes it.
    fn token_ref(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            self.pos += 1;
            if c == '>' {
                let text: String = self.src[start..self.pos].iter().collect();
                if text.len() > 2 && !text[1..text.len() - 1].contains(['<', ' ', '\t']) {
                    return Ok(text);
                }
                break;
            }
            if c == '\n' {
                break;
            }
        }
        Err(self.error_at(start, "a token reference is written <[id]> or <name>".into()))
    }
}

/// `s` as a Lark string literal (JSON's escapes; control characters and DEL escaped).
fn lark_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a regular-expression class: letters and digits as they are, anything
/// else by its code point (no character is special then, the `/` delimiter included).
fn rx_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repetitions_translate() {
        let g = "# a list\nroot ::= item (\",\" ws item)*\nitem ::= [a-z0-9_-]+ | \"\\\"q\\\"\" | [^\\n]{2,4}\nws ::= | \" \"\n";
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: root\n\
             root: item (\",\" ws item)*\n\
             item: /[a-z0-9\\x{5f}\\x{2d}]/+ | \"\\\"q\\\"\" | /[^\\x{a}]/{2,4}\n\
             ws: \"\" | \" \"\n"
        );
    }

    #[test]
    fn rules_continue_after_the_definition_bar_and_inside_parentheses() {
        let g = "root ::=\n  \"{\" (\n    \"a\"\n  | \"b\" )? \"}\"\n  | \"x\"\n";
        assert_eq!(
            to_lark(g).unwrap(),
            "start: root\nroot: \"{\" (\"a\" | \"b\")? \"}\" | \"x\"\n"
        );
        // A line end outside parentheses ends the rule: the next line must start a rule.
        let e = to_lark("root ::= \"a\"\n  \"b\"\n").unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn names_are_made_lark_names_without_collisions() {
        let g = "root ::= Foo-bar foo_bar 9x start\nFoo-bar ::= \"a\"\nfoo_bar ::= \"b\"\n9x ::= \"c\"\nstart ::= \"d\"\n";
        let lark = to_lark(g).unwrap();
        assert!(lark.starts_with("start: root\nroot: foo_bar foo_bar_2 r_9x start_2\n"), "{lark}");
        assert!(lark.contains("\nfoo_bar_2: \"b\"\n") && lark.contains("\nstart_2: \"d\"\n"));
    }

    #[test]
    fn repetition_forms_and_escapes() {
        let lark =
            to_lark("root ::= \"a\"{3} \"b\"{2,} \"c\"{,5} \"d\"{0} \"e\"?* \"\\x41\\u00e9\\t\"\n")
                .unwrap();
        assert_eq!(
            lark,
            "start: root\nroot: \"a\"{3} \"b\"{2,} \"c\"{0,5} (\"e\"?)* \"A\u{e9}\\u0009\"\n"
        );
    }

    #[test]
    fn bad_grammars_name_the_line_and_the_fault() {
        let cases = [
            ("root ::= x\n", 1, "'x' is used but never defined"),
            ("a ::= \"x\"\n", 1, "no 'root' rule"),
            ("root ::= \"a\"\nroot ::= \"b\"\n", 2, "defined twice"),
            ("root ::= \"abc\n", 1, "unterminated string"),
            ("root ::= [a-\n", 1, "unterminated character class"),
            ("root ::= \"a\" | *\n", 1, "'*' must follow an item"),
            ("root ::= (\"a\"\n", 2, "expected ')'"),
            ("root = \"a\"\n", 1, "expected '::='"),
            ("root ::= \"a\"{3,1}\n", 1, "below the minimum"),
            ("root ::= \"\\q\"\n", 1, "unknown escape"),
            ("root ::= [z-a]\n", 1, "backwards"),
            ("root ::= []\n", 1, "empty character class"),
            ("root ::= !<[5]>\n", 1, "negated token"),
        ];
        for (g, line, msg) in cases {
            let e = to_lark(g).unwrap_err();
            assert!(e.msg.contains(msg) && e.line == line, "{g:?}: {e}");
        }
    }

    #[test]
    fn gbnf_is_told_from_lark() {
        assert!(is_gbnf("# comment\n\nroot ::= \"a\""));
        assert!(is_gbnf("  my-rule::= x"));
        assert!(!is_gbnf("start: \"a\""));
        assert!(!is_gbnf("start: \"x ::= y\""));
        assert!(!is_gbnf(""));
    }
}

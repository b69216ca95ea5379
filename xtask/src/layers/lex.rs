//! Rust source to tokens, as far as the layer check needs them: identifiers,
//! `::` and single punctuation, each with its line. Comments, strings (raw,
//! byte and C strings too), character literals, lifetimes and numbers are
//! read past, so a path inside a doc comment or a string is no import.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind<'a> {
    /// An identifier or keyword (`r#` dropped from a raw identifier).
    Ident(&'a str),
    /// `::`.
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A string, character or number literal.
    Literal,
    /// A lifetime or label (`'a`).
    Lifetime,
}

/// One token and the 1-based line it starts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub kind: Kind<'a>,
    pub line: u32,
}

/// Tokens of `src`. Never fails: an unterminated literal or comment runs
/// to the end of the file, which is what rustc would refuse anyway.
pub fn lex(src: &str) -> Vec<Token<'_>> {
    let mut lexer = Lexer {
        src,
        bytes: src.as_bytes(),
        pos: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    line: u32,
    out: Vec<Token<'a>>,
}

impl<'a> Lexer<'a> {
    fn peek(&self, ahead: usize) -> u8 {
        self.bytes.get(self.pos + ahead).copied().unwrap_or(0)
    }

    fn push(&mut self, kind: Kind<'a>, line: u32) {
        self.out.push(Token { kind, line });
    }

    /// Moves past one byte, counting lines.
    fn bump(&mut self) {
        if self.peek(0) == b'\n' {
            self.line += 1;
        }
        self.pos += 1;
    }

    fn run(&mut self) {
        while self.pos < self.bytes.len() {
            let line = self.line;
            let c = self.peek(0);
            match c {
                b'/' if self.peek(1) == b'/' => self.line_comment(),
                b'/' if self.peek(1) == b'*' => self.block_comment(),
                b'"' => {
                    self.quoted(b'"');
                    self.push(Kind::Literal, line);
                }
                b'\'' => self.quote_or_lifetime(),
                b':' if self.peek(1) == b':' => {
                    self.pos += 2;
                    self.push(Kind::PathSep, line);
                }
                b'0'..=b'9' => self.number(),
                c if c == b'_' || c.is_ascii_alphabetic() || c >= 0x80 => self.word(),
                c if c.is_ascii_whitespace() => self.bump(),
                _ => {
                    // Any other ASCII byte is one punctuation character.
                    self.pos += 1;
                    self.push(Kind::Punct(char::from(c)), line);
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while self.pos < self.bytes.len() && self.peek(0) != b'\n' {
            self.pos += 1;
        }
    }

    /// Block comments nest in Rust.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while self.pos < self.bytes.len() {
            if self.peek(0) == b'/' && self.peek(1) == b'*' {
                depth += 1;
                self.pos += 2;
            } else if self.peek(0) == b'*' && self.peek(1) == b'/' {
                depth -= 1;
                self.pos += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// From an opening quote to its closing one, escapes honoured.
    fn quoted(&mut self, quote: u8) {
        self.pos += 1;
        while self.pos < self.bytes.len() {
            match self.peek(0) {
                b'\\' => {
                    self.pos += 1;
                    self.bump();
                }
                c if c == quote => {
                    self.pos += 1;
                    return;
                }
                _ => self.bump(),
            }
        }
    }

    /// `r"…"`, `r#"…"#`: at the `r`'s successor, no escapes, ends at a
    /// quote followed by as many `#` as opened it.
    fn raw_string(&mut self) {
        let mut hashes = 0;
        while self.peek(0) == b'#' {
            hashes += 1;
            self.pos += 1;
        }
        // The opening quote.
        self.pos += 1;
        while self.pos < self.bytes.len() {
            if self.peek(0) == b'"' && (1..=hashes).all(|i| self.peek(i) == b'#') {
                self.pos += 1 + hashes;
                return;
            }
            self.bump();
        }
    }

    /// `'a'`, `'\n'`, `'\u{1F600}'` are literals; `'a` and `'static` are
    /// lifetimes.
    fn quote_or_lifetime(&mut self) {
        let line = self.line;
        let rest = &self.src[self.pos + 1..];
        let mut chars = rest.chars();
        let first = chars.next();
        let second = chars.next();
        if first == Some('\\') || second == Some('\'') {
            self.quoted(b'\'');
            self.push(Kind::Literal, line);
            return;
        }
        self.pos += 1;
        while is_word_byte(self.peek(0)) {
            self.pos += 1;
        }
        self.push(Kind::Lifetime, line);
    }

    fn number(&mut self) {
        let line = self.line;
        while is_word_byte(self.peek(0)) || (self.peek(0) == b'.' && self.peek(1).is_ascii_digit())
        {
            self.pos += 1;
        }
        self.push(Kind::Literal, line);
    }

    /// An identifier, or the prefix of a string literal (`b"`, `r#"`,
    /// `br"`, `c"`, `b'x'`).
    fn word(&mut self) {
        let line = self.line;
        let start = self.pos;
        while is_word_byte(self.peek(0)) {
            self.pos += 1;
        }
        let word = &self.src[start..self.pos];
        let next = self.peek(0);
        let raw_prefix = matches!(word, "r" | "br" | "cr");
        if raw_prefix && (next == b'"' || (next == b'#' && self.raw_follows())) {
            self.raw_string();
            self.push(Kind::Literal, line);
        } else if matches!(word, "b" | "c") && next == b'"' {
            self.quoted(b'"');
            self.push(Kind::Literal, line);
        } else if word == "b" && next == b'\'' {
            self.quoted(b'\'');
            self.push(Kind::Literal, line);
        } else if word == "r" && next == b'#' {
            // A raw identifier: `r#type`.
            self.pos += 1;
            let start = self.pos;
            while is_word_byte(self.peek(0)) {
                self.pos += 1;
            }
            self.push(Kind::Ident(&self.src[start..self.pos]), line);
        } else {
            self.push(Kind::Ident(word), line);
        }
    }

    /// At `#` after `r`: hashes then a quote make a raw string.
    fn raw_follows(&self) -> bool {
        let mut i = 0;
        while self.peek(i) == b'#' {
            i += 1;
        }
        self.peek(i) == b'"'
    }
}

/// Bytes of an identifier or number (non-ASCII is taken as identifier).
fn is_word_byte(c: u8) -> bool {
    c == b'_' || c.is_ascii_alphanumeric() || c >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .map(|t| match t.kind {
                Kind::Ident(s) => s.to_owned(),
                Kind::PathSep => "::".to_owned(),
                Kind::Punct(c) => c.to_string(),
                Kind::Literal => "LIT".to_owned(),
                Kind::Lifetime => "'".to_owned(),
            })
            .collect()
    }

    #[test]
    fn hides_what_is_not_code() {
        let cases: &[(&str, &str)] = &[
            ("a::b", "a :: b"),
            ("// crate::x\ny", "y"),
            ("/* crate::x /* nested */ still */ y", "y"),
            ("\"crate::x \\\" crate::y\" z", "LIT z"),
            ("r#\"crate::x \" still\"# z", "LIT z"),
            ("br\"x\" b\"y\" c\"w\" b'q' z", "LIT LIT LIT LIT z"),
            ("'a' '\\'' '\\u{1F600}' 'é' z", "LIT LIT LIT LIT z"),
            ("fn f<'a>(x: &'a str)", "fn f < ' > ( x : & ' str )"),
            ("r#type::x", "type :: x"),
            ("0..n 1.5 0x1F_u8", "LIT . . n LIT LIT"),
        ];
        for (src, want) in cases {
            assert_eq!(idents(src).join(" "), *want, "{src}");
        }
    }

    #[test]
    fn counts_lines_through_literals_and_comments() {
        let src = "a\n/* x\n y */ b \"s\n t\" c\n// d\ne";
        let lines: Vec<u32> = lex(src).iter().map(|t| t.line).collect();
        assert_eq!(lines, [1, 3, 3, 4, 6]);
    }
}

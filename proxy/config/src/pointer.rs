//! JSON pointers (RFC 6901) as used by `response.pick`, `redact` and `evidence`, with one
//! extension: a `*` token matches every element of an array or member of an object.

/// A parsed pointer: its unescaped reference tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// Unescaped tokens; `None` is the `*` wildcard.
    pub tokens: Vec<Option<String>>,
}

impl Pointer {
    /// Parses `""` (the whole document) or `/a/b~1c/*`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Ok(Self { tokens: Vec::new() });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "`{text}` is not a JSON pointer: it must be empty or start with `/`"
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            if raw == "*" {
                tokens.push(None);
                continue;
            }
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(format!("`{text}` has a `~` not followed by 0 or 1")),
                    }
                } else {
                    token.push(c);
                }
            }
            tokens.push(Some(token));
        }
        Ok(Self { tokens })
    }

    /// Whether the pointer contains a `*` token.
    pub fn has_wildcard(&self) -> bool {
        self.tokens.iter().any(Option::is_none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escapes_and_wildcards() {
        let p = Pointer::parse("/a~1b/*/c~0d").unwrap();
        assert_eq!(p.tokens, vec![Some("a/b".into()), None, Some("c~d".into())]);
        assert!(p.has_wildcard());
        assert!(Pointer::parse("").unwrap().tokens.is_empty());
    }

    #[test]
    fn rejects_malformed_pointers() {
        assert!(Pointer::parse("id").unwrap_err().contains("start with `/`"));
        assert!(Pointer::parse("/a~2").is_err());
    }
}

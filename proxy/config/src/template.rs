//! `{name}` templates used by the HTTP mapping (path, query values, header values).

use std::fmt;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text copied as written.
    Literal(String),
    /// `{name}`: the value of argument `name`.
    Var(String),
}

/// A parsed template such as `/customers/{customerId}/tickets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The pieces in order.
    pub segments: Vec<Segment>,
}

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Template {
    /// Parses `text`; `{{` and `}}` stand for literal braces.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|(_, c)| *c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|(_, c)| *c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let rest = &text[i + 1..];
                    let end = rest
                        .find('}')
                        .ok_or_else(|| TemplateError(format!("unclosed `{{` at offset {i}")))?;
                    let name = &rest[..end];
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
                    {
                        return Err(TemplateError(format!(
                            "`{{{name}}}` is not a valid placeholder: use `{{argumentName}}` with letters, digits, `_`, `-` or `.`"
                        )));
                    }
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(Segment::Var(name.to_string()));
                    for _ in 0..=end {
                        chars.next();
                    }
                }
                '}' => return Err(TemplateError(format!("unmatched `}}` at offset {i}"))),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        Ok(Self { segments })
    }

    /// Names of the placeholders, in order.
    pub fn vars(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Var(v) => Some(v.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The literal text pieces.
    pub fn literals(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Literal(l) => Some(l.as_str()),
            Segment::Var(_) => None,
        })
    }

    /// The template is exactly one placeholder (`"{tags}"`).
    pub fn single_var(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [Segment::Var(v)] => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_literals_and_placeholders() {
        let t = Template::parse("/customers/{customerId}/tickets/{ticket_id}.json").unwrap();
        assert_eq!(
            t.segments,
            vec![
                Segment::Literal("/customers/".into()),
                Segment::Var("customerId".into()),
                Segment::Literal("/tickets/".into()),
                Segment::Var("ticket_id".into()),
                Segment::Literal(".json".into()),
            ]
        );
        assert_eq!(t.vars().collect::<Vec<_>>(), ["customerId", "ticket_id"]);
    }

    #[test]
    fn doubled_braces_are_literal() {
        let t = Template::parse("a{{b}}").unwrap();
        assert_eq!(t.segments, vec![Segment::Literal("a{b}".into())]);
    }

    #[test]
    fn unclosed_and_empty_placeholders_are_errors() {
        assert!(Template::parse("/x/{id").unwrap_err().0.contains("unclosed"));
        assert!(Template::parse("/x/{}").is_err());
        assert!(Template::parse("/x/{a b}").is_err());
        assert!(Template::parse("/x/}").unwrap_err().0.contains("unmatched"));
    }

    #[test]
    fn single_var_detects_whole_value_placeholders() {
        assert_eq!(Template::parse("{tags}").unwrap().single_var(), Some("tags"));
        assert_eq!(Template::parse("x{tags}").unwrap().single_var(), None);
    }
}

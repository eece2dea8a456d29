//! A descriptor value with `*` wildcards, as rules and lists hold it: each `*` matches any run of characters.

/// A value with `*` wildcards, each matching any run of characters.
#[derive(Debug)]
pub(super) struct Pattern {
    parts: Box<[Box<str>]>,
}

impl Pattern {
    pub(super) fn new(value: &str) -> Pattern {
        Pattern {
            parts: value.split('*').map(Box::from).collect(),
        }
    }

    /// The bytes it takes.
    pub(super) fn memory_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.len() + 16).sum()
    }

    pub(super) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some(mut tail) = value.strip_prefix(&**first) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return tail.is_empty();
        };
        for part in middle {
            match tail.find(&**part) {
                Some(at) => tail = &tail[at + part.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(&**last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_anywhere() {
        let p = Pattern::new("/api/*/items*");
        assert!(p.matches("/api/v1/items"));
        assert!(p.matches("/api/v1/items/3"));
        assert!(!p.matches("/api/v1/things"));
        assert!(Pattern::new("*").matches(""));
        assert!(Pattern::new("a*a").matches("aa"));
        assert!(!Pattern::new("a*a").matches("a"));
        assert!(Pattern::new("*.png").matches("x.png"));
        assert!(!Pattern::new("*.png").matches("x.pngx"));
    }
}

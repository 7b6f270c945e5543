//! What a target is given to know the canary by (its API key, the password of credentials in its
//! URL, the Basic authorization they make, the values of a config's `request.headers`, such as a
//! gateway's key) and the one masking of it out of any text a server
//! sends back: a server that echoes the request's `Authorization` header in an error body or a
//! stream's error frame must not get the canary to republish its key in a log line, the status
//! API, `requests.jsonl`, OTLP or a Kubernetes Event. Every server text becomes a record's text
//! through [`super::stream::sanitize`], which masks with the target's [`Secrets`] first.

use std::borrow::Cow;
use std::sync::Arc;

/// What a secret is replaced by, as credentials in URLs are (`config::display_url`).
pub use crate::config::MASK;

/// The secrets one target was sent, in every spelling a server may echo them in; cheap to clone.
/// Its `Debug` shows how many, never what.
#[derive(Clone, Default)]
pub struct Secrets(Option<Arc<[Box<str>]>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} redacted)", self.spellings().len())
    }
}

impl Secrets {
    /// No secrets: text is left as it is.
    pub const fn none() -> Self {
        Secrets(None)
    }

    /// These secrets and `secret`, as written and as a JSON string writes it (`\"`, `\\`, and
    /// `\/` as some encoders write a slash). An empty secret is none.
    pub fn with(&self, secret: &str) -> Self {
        let mut all: Vec<Box<str>> = self.spellings().to_vec();
        let json = serde_json::to_string(secret).unwrap_or_default();
        let json = json.get(1..json.len().saturating_sub(1)).unwrap_or("");
        for spelling in [secret.to_owned(), json.to_owned(), json.replace('/', "\\/")] {
            if !spelling.is_empty() && !all.iter().any(|s| **s == *spelling) {
                all.push(spelling.into());
            }
        }
        // The longest first: a secret inside another is masked as part of the longer one.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(Some(all.into()))
    }

    fn spellings(&self) -> &[Box<str>] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// `text` with every occurrence of a secret replaced by [`MASK`]; borrowed when it holds none.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in self.spellings() {
            if out.contains(&**secret) {
                out = Cow::Owned(out.replace(&**secret, MASK));
            }
        }
        out
    }

    /// [`Secrets::mask`] of text cut from a longer one (the first bytes of an error body): a
    /// secret the cut went through leaves its beginning at the end, which is masked too.
    pub fn mask_cut<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let masked = self.mask(text);
        let tail = self
            .spellings()
            .iter()
            .filter_map(|secret| {
                (1..secret.len())
                    .rev()
                    .filter(|&n| secret.is_char_boundary(n))
                    .find(|&n| masked.ends_with(&secret[..n]))
            })
            .max();
        match tail {
            Some(n) => {
                let keep = masked.len() - n;
                Cow::Owned(format!("{}{MASK}", &masked[..keep]))
            }
            None => masked,
        }
    }

    /// Whether `text` holds a secret.
    pub fn found_in(&self, text: &str) -> bool {
        self.spellings().iter().any(|s| text.contains(&**s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_occurrence_is_masked_and_the_rest_kept() {
        let s = Secrets::none().with("sk-abc/123");
        assert_eq!(
            s.mask(r#"{"error":"bad key","auth":"Bearer sk-abc/123","again":"sk-abc\/123"}"#),
            r#"{"error":"bad key","auth":"Bearer ***","again":"***"}"#
        );
        assert!(matches!(s.mask("nothing secret"), Cow::Borrowed(_)));
        assert!(s.found_in("xsk-abc/123x") && !s.found_in("sk-abc"));
        // No secrets, or an empty one: nothing changes.
        assert_eq!(Secrets::none().with("").mask("text"), "text");
        assert_eq!(Secrets::default().mask("text"), "text");
        assert_eq!(format!("{s:?}"), "Secrets(2 redacted)");
    }

    #[test]
    fn a_secret_inside_another_is_masked_with_it() {
        let s = Secrets::none().with("pass").with("dXNlcjpwYXNz-pass");
        assert_eq!(s.mask("a dXNlcjpwYXNz-pass b pass"), "a *** b ***");
    }

    #[test]
    fn a_cut_through_a_secret_masks_its_beginning() {
        let s = Secrets::none().with("sk-canary-secret");
        assert_eq!(s.mask_cut("said: Bearer sk-can"), "said: Bearer ***");
        assert_eq!(s.mask_cut("sk-canary-secret sk-canary-secre"), "*** ***");
        assert_eq!(s.mask_cut("nothing here"), "nothing here");
        // A whole secret at the end is masked once.
        assert_eq!(s.mask_cut("Bearer sk-canary-secret"), "Bearer ***");
    }
}

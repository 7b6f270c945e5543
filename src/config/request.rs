//! What a target or a workload adds to the requests the canary sends (`request:`): fields merged
//! into the JSON body (`extra_body`), extra headers (`headers`), whether they stream (`stream`)
//! and, for a workload, the API; and the body fields and headers the canary owns, which neither
//! may set, with why. A workload's setting wins over its target's.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use super::at::At;
use super::error::Diagnostic;
use super::target::Api;

/// The body fields the canary sets itself, and why they stay its own: each is part of what the
/// measurement means (docs/DESIGN.md §4), so a config that set one would measure something else.
pub const OWNED_BODY_FIELDS: [(&str, &str); 11] = [
    ("model", "it is the target's `model`"),
    ("messages", "the workload builds the prompt"),
    ("prompt", "the workload builds the prompt"),
    (
        "stream",
        "`request.stream: false` sends non-streaming requests, measured as such",
    ),
    (
        "stream_options",
        "token counts are read from the stream's usage",
    ),
    ("max_tokens", "the workload sets the output length"),
    (
        "max_completion_tokens",
        "the workload sets the output length",
    ),
    ("min_tokens", "the workload sets the output length"),
    ("ignore_eos", "the workload sets the output length"),
    ("n", "one request measures one completion"),
    ("user", "it is the traffic marker (`client.user`)"),
];

/// What the canary asks for inside Dynamo's `nvext`: the rest of `nvext` may be added to.
pub const OWNED_NVEXT_FIELDS: [(&str, &str); 1] = [(
    "extra_fields",
    "the canary asks for `timing` and `worker_id` there to split the TTFT",
)];

/// The headers the canary sets itself (lower case), and why a config may not.
pub const OWNED_HEADERS: [(&str, &str); 11] = [
    (
        "authorization",
        "set `api_key_env` or `api_key_file` on the target",
    ),
    ("content-type", "the body is JSON"),
    ("content-length", "it is the body's length"),
    ("host", "it is the target URL's"),
    ("transfer-encoding", "the body is sent with its length"),
    ("connection", "the canary keeps connections alive itself"),
    ("te", "the canary reads plain responses"),
    ("accept", "the canary asks for an event stream"),
    (
        "accept-encoding",
        "a compressed stream would delay every token's arrival",
    ),
    (
        "x-request-id",
        "it is the canary's id of each request, in its records and the server's logs",
    ),
    ("user-agent", "it names the canary and its version"),
];

/// Why `name` is a header the canary owns, if it is one (any case).
pub fn owned_header(name: &str) -> Option<&'static str> {
    OWNED_HEADERS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, why)| *why)
}

/// Why `field` is a body field the canary owns, if it is one.
pub fn owned_body_field(field: &str) -> Option<&'static str> {
    OWNED_BODY_FIELDS
        .iter()
        .find(|(n, _)| *n == field)
        .map(|(_, why)| *why)
}

/// Why `field` of `nvext` is the canary's, if it is.
pub fn owned_nvext_field(field: &str) -> Option<&'static str> {
    OWNED_NVEXT_FIELDS
        .iter()
        .find(|(n, _)| *n == field)
        .map(|(_, why)| *why)
}

/// The `request:` of a target or a workload. A workload's overrides its targets' key by key:
/// its body fields are merged over theirs, its headers replace theirs of the same name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestOptions {
    /// The API of a workload's requests, instead of each target's `api` (a workload only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<At<Api>>,
    /// Fields merged into the JSON body; objects merge deeply (`nvext` adds to the canary's).
    #[serde(default, skip_serializing_if = "ExtraBody::is_empty")]
    pub extra_body: ExtraBody,
    /// Extra headers; their values are secrets, masked out of everything the canary shows.
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// `false`: send `"stream": false` and read one JSON answer (TTFT is then the request's
    /// latency, and it has no ITL); unset: the workload's target decides, else streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<At<bool>>,
}

impl RequestOptions {
    pub fn is_empty(&self) -> bool {
        self.api.is_none()
            && self.extra_body.is_empty()
            && self.headers.is_empty()
            && self.stream.is_none()
    }

    /// The options in one line for `check`'s summary, header values masked; empty when none.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(api) = &self.api {
            parts.push(format!("api {:?}", **api).to_lowercase());
        }
        if !self.extra_body.is_empty() {
            parts.push(format!("extra_body {:?}", self.extra_body));
        }
        if !self.headers.is_empty() {
            let shown: Vec<String> = self
                .headers
                .0
                .iter()
                .map(|(n, _)| format!("{}: {}", **n, super::MASK))
                .collect();
            parts.push(format!("headers {{{}}}", shown.join(", ")));
        }
        if let Some(stream) = &self.stream {
            parts.push(format!("stream {}", **stream));
        }
        parts.join(", ")
    }
}

/// The `extra_body` mapping: each top-level key where it was written, with its value as JSON.
#[derive(Clone, Default, PartialEq)]
pub struct ExtraBody(pub Vec<(At<String>, serde_json::Value)>);

impl ExtraBody {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields as one JSON object.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.0
            .iter()
            .map(|(k, v)| (k.value.clone(), v.clone()))
            .collect()
    }
}

impl fmt::Debug for ExtraBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", serde_json::Value::Object(self.to_json()))
    }
}

impl<'de> Deserialize<'de> for ExtraBody {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = ExtraBody;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of body fields, e.g. `{temperature: 0}`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExtraBody, A::Error> {
                let mut fields: Vec<(At<String>, serde_json::Value)> = Vec::new();
                while let Some(key) = map.next_key::<At<String>>()? {
                    if fields.iter().any(|(k, _)| k.value == key.value) {
                        return Err(de::Error::custom(format!(
                            "`{}` is written twice",
                            key.value
                        )));
                    }
                    fields.push((key, map.next_value()?));
                }
                Ok(ExtraBody(fields))
            }
        }
        d.deserialize_map(Fields)
    }
}

impl Serialize for ExtraBody {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(&k.value, v)?;
        }
        map.end()
    }
}

/// The `headers` mapping, each name and value where it was written. The values may be
/// credentials (a gateway's key): `Debug` and `Serialize` (`check --output yaml`) show `***`.
#[derive(Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(At<String>, At<String>)>);

impl Headers {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(n, _)| (n.as_str(), super::MASK)))
            .finish()
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Headers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of header names to values, e.g. `{X-Tenant: team-a}`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
                let mut entries: Vec<(At<String>, At<String>)> = Vec::new();
                while let Some(name) = map.next_key::<At<String>>()? {
                    let value: At<String> = map.next_value()?;
                    entries.push((name, value));
                }
                Ok(Headers(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

impl Serialize for Headers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (n, _) in &self.0 {
            map.serialize_entry(n.as_str(), super::MASK)?;
        }
        map.end()
    }
}

/// The problems of a target's or a workload's `request:` at key path `at`: a body field or
/// header the canary owns (or the configured marker header `marker`), a header name or value
/// HTTP cannot carry, a header written twice, `api` anywhere but on a workload (`workload`).
pub(super) fn problems(
    r: &RequestOptions,
    at: &str,
    workload: bool,
    marker: Option<&str>,
) -> Vec<Diagnostic> {
    let mut p = Problems(Vec::new());
    p.request_options(r, at, workload, marker);
    p.0
}

/// The problems found so far.
struct Problems(Vec<Diagnostic>);

impl Problems {
    fn err(&mut self, pos: Option<(u64, u64)>, msg: impl Into<String>, hint: Option<String>) {
        let mut d = Diagnostic::new(pos, msg);
        d.hint = hint;
        self.0.push(d);
    }

    fn request_options(
        &mut self,
        r: &RequestOptions,
        at: &str,
        workload: bool,
        marker: Option<&str>,
    ) {
        if let Some(api) = &r.api
            && !workload
        {
            self.err(
                api.pos,
                format!("`{at}.api`: a target's API is its own `api` key"),
                Some("move it to the target's `api:`, or to a workload's `request.api`".into()),
            );
        }
        self.extra_body(&r.extra_body, at);
        self.headers(&r.headers, at, marker);
    }

    fn extra_body(&mut self, body: &ExtraBody, at: &str) {
        for (key, value) in &body.0 {
            if let Some(why) = owned_body_field(key) {
                self.err(
                    key.pos,
                    format!(
                        "`{at}.extra_body.{}` is the canary's own field: {why}",
                        **key
                    ),
                    Some("remove it; the canary's measurement depends on its own value".into()),
                );
            }
            if key.as_str() != "nvext" {
                continue;
            }
            match value {
                serde_json::Value::Object(fields) => {
                    for (field, _) in fields {
                        if let Some(why) = owned_nvext_field(field) {
                            self.err(
                                key.pos,
                                format!("`{at}.extra_body.nvext.{field}` is the canary's own field: {why}"),
                                Some("remove it; other `nvext` fields are merged with the canary's".into()),
                            );
                        }
                    }
                }
                _ => self.err(
                    key.pos,
                    format!("`{at}.extra_body.nvext` must be a mapping: it is merged into the `nvext` the canary sends"),
                    Some("write e.g. `nvext: {backend_instance_id: 1}`".into()),
                ),
            }
        }
    }

    fn headers(&mut self, headers: &Headers, at: &str, marker: Option<&str>) {
        for (i, (name, value)) in headers.0.iter().enumerate() {
            let key = format!("`{at}.headers.{}`", **name);
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                self.err(
                    name.pos,
                    format!("{key}: `{}` is not a header name", **name),
                    Some("use letters, digits and `-`, e.g. `X-Tenant`".into()),
                );
                continue;
            }
            if let Some(why) = owned_header(name) {
                self.err(
                    name.pos,
                    format!("{key} is a header the canary sets itself: {why}"),
                    Some("remove it".into()),
                );
            } else if marker.is_some_and(|m| m.eq_ignore_ascii_case(name)) {
                self.err(
                    name.pos,
                    format!("{key} is the traffic marker the canary sets (`client.marker_header`)"),
                    Some("change `client.marker_header`, or remove this header".into()),
                );
            }
            if headers.0[..i]
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                self.err(
                    name.pos,
                    format!("{key} is written twice (header names ignore case)"),
                    Some("keep one".into()),
                );
            }
            // The value is never shown: it may be a credential.
            if http::HeaderValue::from_str(value).is_err() || value.trim() != value.as_str() {
                self.err(
                    value.pos,
                    format!("{key} has a value an HTTP header cannot carry (a line break, a control character or surrounding spaces)"),
                    Some("write the value on one line, without control characters".into()),
                );
            }
        }
    }
}

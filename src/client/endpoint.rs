//! One target's endpoint: where a request goes (URL, API, model), what the dialect sends and
//! expects (length fields, `nvext`, how a stream ends, whether chunks name the model), how the
//! canary authenticates, what a config adds to its requests (`request:`: body fields, headers, the
//! API of a workload), and the secrets it masks out of what the target answers.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value};
use url::Url;

use crate::config::{Api, Dialect, LengthControl, RequestOptions};

use super::body::{BodyExtra, BodySpec};
use super::secret::Secrets;
use super::tls::TargetTls;
use super::{ClientError, http, transport};

/// A bearer API key. It has no `Display` and its `Debug` is redacted, so it cannot reach a log by
/// accident.
#[derive(Clone)]
pub struct ApiKey(pub(super) String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// `Bearer <key>` as a header value marked sensitive, which keeps it out of HTTP-level
    /// debug output too.
    pub fn authorization(&self) -> Result<HeaderValue, ClientError> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.0))
            .map_err(|_| ClientError::InvalidApiKey)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where and how to send: one target's endpoint.
#[derive(Clone)]
pub struct Endpoint {
    pub(super) url: Url,
    pub(super) api: Api,
    pub(super) model: String,
    pub(super) length_control: LengthControl,
    pub(super) nvext: bool,
    /// The dialect ends streams after `finish_reason` without `[DONE]`.
    pub(super) ends_at_finish_reason: bool,
    /// The dialect's server names the requested model in every chunk.
    pub(super) echoes_model: bool,
    pub(super) authorization: Option<HeaderValue>,
    /// What it is sent to know the canary by (its key, the password in its URL), masked out of
    /// every text of its answers that the canary keeps.
    pub(super) secrets: Secrets,
    /// Where its connections go: `host:port`, and the TLS config of an `https://` target.
    pub(super) origin: Arc<transport::Origin>,
    /// Set once a rejection of the body's extension fields was logged, so a server that rejects
    /// every request logs the fix once, not at request rate.
    pub(super) rejection_logged: Arc<AtomicBool>,
    /// The engine's KV block size in tokens, where the server reports it (Dynamo's frontend
    /// `/metrics`): what turns the router's `kv_hit_rate` back into whole reused blocks.
    pub(super) kv_block_size: Option<u32>,
    /// The body fields a config adds (the target's, then a workload's merged over them) ...
    pub(super) extra_fields: Arc<Map<String, Value>>,
    /// ... and them serialised once, as every body of this endpoint carries them.
    pub(super) body_extra: Arc<BodyExtra>,
    /// The headers a config adds, each value marked sensitive and among the `secrets`.
    pub(super) headers: Arc<[(HeaderName, HeaderValue)]>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field("api", &self.api)
            .field("model", &self.model)
            .field("length_control", &self.length_control)
            .field("nvext", &self.nvext)
            .field(
                "api_key",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.origin.is_tls())
            .field("extra_body", &self.extra_fields)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Endpoint {
    /// An endpoint on `base_url` (`http://host:8000` or `http://host:8000/v1`), with the length
    /// fields and `nvext` the dialect accepts.
    pub fn new(
        base_url: &str,
        api: Api,
        model: impl Into<String>,
        dialect: Dialect,
    ) -> Result<Self, ClientError> {
        // Shown without any credentials in it, as every URL the canary prints.
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: crate::config::display_url_text(base_url),
            reason: reason.to_owned(),
        };
        let mut url = Url::parse(base_url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if url.cannot_be_a_base() {
            return Err(invalid("not a base URL"));
        }
        let base_path = url.path().trim_end_matches('/');
        let suffix = api_suffix(api);
        let path = if base_path.ends_with("/v1") {
            format!("{base_path}{suffix}")
        } else {
            format!("{base_path}/v1{suffix}")
        };
        url.set_path(&path);
        let tls = match url.scheme() {
            "https" => Some(TargetTls::platform()?),
            _ => None,
        };
        let origin = transport::Origin::new(&url, tls).map_err(|e| invalid(&e.to_string()))?;
        Ok(Self {
            authorization: http::basic_authorization(&url),
            secrets: http::url_secrets(&url),
            url,
            api,
            model: model.into(),
            length_control: dialect.length_control(),
            nvext: dialect.supports_nvext(),
            ends_at_finish_reason: dialect.ends_at_finish_reason(),
            echoes_model: dialect.echoes_model(),
            origin: Arc::new(origin),
            rejection_logged: Arc::new(AtomicBool::new(false)),
            kv_block_size: None,
            extra_fields: Arc::default(),
            body_extra: Arc::default(),
            headers: Arc::from([]),
        })
    }

    /// Connects to this `https://` endpoint with `tls` (built by [`TargetTls::from_files`])
    /// instead of the platform's roots; an `http://` endpoint stays plain.
    pub fn with_tls(mut self, tls: Arc<TargetTls>) -> Result<Self, ClientError> {
        let origin =
            transport::Origin::new(&self.url, Some(tls)).map_err(|e| ClientError::InvalidUrl {
                url: crate::config::display_url(&self.url),
                reason: e.to_string(),
            })?;
        self.origin = Arc::new(origin);
        Ok(self)
    }

    /// Overrides the dialect's length-control preset.
    pub fn with_length_control(mut self, length_control: LengthControl) -> Self {
        self.length_control = length_control;
        self
    }

    /// Asks (or stops asking) for `nvext.timing` and `nvext.worker_id`.
    pub fn with_nvext(mut self, nvext: bool) -> Self {
        self.nvext = nvext;
        // A `nvext` of the extra fields merges with the canary's only while it sends one. The
        // fields passed `BodyExtra::new` when they were added, whatever the flag: no error here.
        self.body_extra =
            Arc::new(BodyExtra::new(nvext, &self.extra_fields).unwrap_or(BodyExtra::NONE));
        self
    }

    /// This endpoint with `options` added (a target's `request:`, then a workload's over it):
    /// its `api` in place of this one's, its body fields merged deeply over the ones already
    /// added, its headers in place of those of the same name. The body fields are serialised
    /// here, once, and every header value joins the secrets masked out of what the target
    /// answers.
    pub fn with_request(mut self, options: &RequestOptions) -> Result<Self, ClientError> {
        if let Some(api) = &options.api {
            self = self.with_api(**api);
        }
        if !options.extra_body.is_empty() {
            let mut fields = (*self.extra_fields).clone();
            super::body::merge(&mut fields, &options.extra_body.to_json());
            self.body_extra = Arc::new(BodyExtra::new(self.nvext, &fields)?);
            self.extra_fields = Arc::new(fields);
        }
        if !options.headers.is_empty() {
            let mut headers: Vec<(HeaderName, HeaderValue)> = self.headers.to_vec();
            for (name, text) in &options.headers.0 {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ClientError::InvalidHeader {
                        name: name.value.clone(),
                    }
                })?;
                if crate::config::owned_header(name.as_str()).is_some() {
                    return Err(ClientError::OwnedHeader(name.to_string()));
                }
                let mut value =
                    HeaderValue::from_str(text).map_err(|_| ClientError::InvalidHeader {
                        name: name.to_string(),
                    })?;
                value.set_sensitive(true);
                // As written: a value beyond ASCII has no `to_str`, and is a secret all the same.
                self.secrets = self.secrets.with(text);
                headers.retain(|(n, _)| *n != name);
                headers.push((name, value));
            }
            self.headers = headers.into();
        }
        Ok(self)
    }

    /// Requests go to `api`'s path under the same base URL.
    fn with_api(mut self, api: Api) -> Self {
        if api == self.api {
            return self;
        }
        let path = self.url.path();
        let base = path
            .strip_suffix(api_suffix(self.api))
            .unwrap_or(path)
            .to_owned();
        self.url.set_path(&format!("{base}{}", api_suffix(api)));
        self.api = api;
        self
    }

    /// The engine's KV block size, as the server reports it (`None`: unknown).
    pub fn with_kv_block_size(mut self, tokens: Option<u32>) -> Self {
        self.kv_block_size = tokens.filter(|&b| b > 0);
        self
    }

    pub fn kv_block_size(&self) -> Option<u32> {
        self.kv_block_size
    }

    /// Sends `Authorization: Bearer <key>` with every request (in place of the Basic
    /// authorization of credentials in the URL).
    pub fn with_api_key(mut self, key: &ApiKey) -> Result<Self, ClientError> {
        self.authorization = Some(key.authorization()?);
        self.secrets = self.secrets.with(&key.0);
        Ok(self)
    }

    /// What this endpoint is sent to know the canary by, to mask out of what it answers.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The full URL requests go to.
    pub fn url(&self) -> &Url {
        &self.url
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn length_control(&self) -> LengthControl {
        self.length_control
    }

    pub fn nvext(&self) -> bool {
        self.nvext
    }

    pub(super) fn body_spec<'a>(&'a self, user: Option<&'a str>) -> BodySpec<'a> {
        BodySpec {
            api: self.api,
            model: &self.model,
            length_control: self.length_control,
            nvext: self.nvext,
            user,
            extra: &self.body_extra,
        }
    }
}

/// The path of `api` under a `/v1` base.
fn api_suffix(api: Api) -> &'static str {
    match api {
        Api::Chat => "/chat/completions",
        Api::Completions => "/completions",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(yaml: &str) -> RequestOptions {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_workloads_options_go_over_the_targets() {
        let target = Endpoint::new("http://127.0.0.1:1/v1", Api::Chat, "m", Dialect::Dynamo)
            .unwrap()
            .with_request(&options(
                "{extra_body: {temperature: 0.5, nvext: {a: 1}}, headers: {X-Route: one, X-Key: sk-target-123}}",
            ))
            .unwrap();
        let workload = target
            .clone()
            .with_request(&options(
                "{api: completions, extra_body: {temperature: 0, nvext: {b: 2}}, headers: {x-route: two}}",
            ))
            .unwrap();
        assert_eq!(target.url().path(), "/v1/chat/completions");
        assert_eq!(workload.url().path(), "/v1/completions");
        assert_eq!(workload.api(), Api::Completions);
        let body = super::super::body::encode(
            &workload.body_spec(None),
            &super::super::body::Prompt::Text("x".into()),
            3,
        );
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["temperature"], 0);
        assert_eq!(
            body["nvext"],
            serde_json::json!({"extra_fields": ["timing", "worker_id"], "a": 1, "b": 2})
        );
        let headers: Vec<(&str, &str)> = workload
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("x-key", "sk-target-123"), ("x-route", "two")]);
        assert!(workload.headers.iter().all(|(_, v)| v.is_sensitive()));
        // Every header value is a secret, and none is shown.
        assert_eq!(
            workload.secrets().mask("one two sk-target-123"),
            "*** *** ***"
        );
        // A value beyond ASCII is masked as written.
        let utf8 = workload
            .with_request(&options("{headers: {X-Team: équipe-a}}"))
            .unwrap();
        assert_eq!(utf8.secrets().mask("team équipe-a"), "team ***");
        let shown = format!("{utf8:?}");
        assert!(
            shown.contains("x-route") && !shown.contains("sk-target"),
            "{shown}"
        );
    }

    #[test]
    fn headers_the_canary_owns_are_refused() {
        let ep = Endpoint::new("http://127.0.0.1:1", Api::Chat, "m", Dialect::Vllm).unwrap();
        assert!(matches!(
            ep.clone()
                .with_request(&options("{headers: {Authorization: Bearer x}}")),
            Err(ClientError::OwnedHeader(_))
        ));
        assert!(matches!(
            ep.with_request(&options("{extra_body: {stream: false}}")),
            Err(ClientError::ExtraBody(_))
        ));
    }
}

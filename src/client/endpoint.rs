//! One target's endpoint: where a request goes (URL, API, model), what the dialect sends and
//! expects (length fields, `nvext`, how a stream ends, whether chunks name the model), how the
//! canary authenticates, and the secrets it masks out of what the target answers.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use reqwest::header::HeaderValue;
use url::Url;

use crate::config::{Api, Dialect, LengthControl};

use super::body::BodySpec;
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
        let suffix = match api {
            Api::Chat => "chat/completions",
            Api::Completions => "completions",
        };
        let path = if base_path.ends_with("/v1") {
            format!("{base_path}/{suffix}")
        } else {
            format!("{base_path}/v1/{suffix}")
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
        }
    }
}

//! An in-process mock of the Kubernetes API server for the kube tests: a `tower` service a real
//! `kube::Client` talks to, holding objects by collection path, with list, watch (streamed
//! events since a resource version), get, create, merge/strategic/apply patch (a Lease apply
//! that takes another holder's Lease is a 409 Conflict, as field ownership makes it), and an
//! outage switch that answers 500 to everything.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

type Body = UnsyncBoxBody<Bytes, Infallible>;

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// collection path → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    history: Vec<Change>,
    failing: bool,
    uid: u64,
}

/// The mock API server; clones share it.
#[derive(Clone)]
pub struct MockApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
}

/// `/api/v1/namespaces/{ns}/pods` and the like.
pub fn collection(api_version: &str, ns: &str, plural: &str) -> String {
    if api_version.contains('/') {
        format!("/apis/{api_version}/namespaces/{ns}/{plural}")
    } else {
        format!("/api/{api_version}/namespaces/{ns}/{plural}")
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": reason, "message": message, "code": code.as_u16()}),
    )
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .unwrap()
}

/// RFC 7386 JSON merge patch (strategic merge patches of the objects used here merge the same).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn selector_matches(selector: &str, obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels[k].as_str() == Some(v),
            None => labels.get(term).is_some(),
        })
}

fn query(req: &Request<kube::client::Body>) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

impl MockApi {
    pub fn new() -> MockApi {
        MockApi {
            state: Arc::default(),
            changes: broadcast::channel(1024).0,
        }
    }

    /// A client whose requests this mock answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every request fails with 500 while `failing` (an API server outage).
    pub fn set_failing(&self, failing: bool) {
        self.with(|s| s.failing = failing);
    }

    fn record(
        &self,
        s: &mut State,
        collection: &str,
        kind: &'static str,
        mut object: Value,
    ) -> Value {
        s.rv += 1;
        object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        if object["metadata"]["uid"].is_null() {
            s.uid += 1;
            object["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
        }
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let items = s.objects.entry(collection.to_owned()).or_default();
        if kind == "DELETED" {
            items.remove(&name);
        } else {
            items.insert(name, object.clone());
        }
        let change = Change {
            rv: s.rv,
            collection: collection.to_owned(),
            kind,
            object: object.clone(),
        };
        s.history.push(change.clone());
        let _ = self.changes.send(change);
        object
    }

    /// Creates or replaces an object (as a controller or another replica would).
    pub fn put(&self, collection: &str, object: Value) -> Value {
        self.with(|s| {
            let name = object["metadata"]["name"].as_str().unwrap().to_owned();
            let exists = s
                .objects
                .get(collection)
                .is_some_and(|m| m.contains_key(&name));
            let mut object = object;
            if let Some(old) = s.objects.get(collection).and_then(|m| m.get(&name)) {
                object["metadata"]["uid"] = old["metadata"]["uid"].clone();
            }
            self.record(
                s,
                collection,
                if exists { "MODIFIED" } else { "ADDED" },
                object,
            )
        })
    }

    pub fn delete(&self, collection: &str, name: &str) {
        self.with(|s| {
            if let Some(o) = s.objects.get(collection).and_then(|m| m.get(name)).cloned() {
                self.record(s, collection, "DELETED", o);
            }
        });
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.with(|s| s.objects.get(collection).and_then(|m| m.get(name)).cloned())
    }

    pub fn list(&self, collection: &str) -> Vec<Value> {
        self.with(|s| {
            s.objects
                .get(collection)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default()
        })
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Response<Body> {
        if self.with(|s| s.failing) {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "mock outage",
            );
        }
        let q = query(&req);
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        // A collection path has an even number of segments after /api/v1 or /apis/g/v.
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let base = if segments[0] == "api" { 2 } else { 3 };
        let is_item = segments.len() - base == 4;
        let (coll, name) = if is_item {
            (
                format!("/{}", segments[..segments.len() - 1].join("/")),
                Some(segments[segments.len() - 1].to_owned()),
            )
        } else {
            (path.clone(), None)
        };
        match (method.as_str(), name) {
            ("GET", None) if q.get("watch").map(String::as_str) == Some("true") => {
                let since: u64 = q
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                self.watch(
                    coll,
                    since,
                    q.get("labelSelector").cloned().unwrap_or_default(),
                )
            }
            ("GET", None) => {
                let sel = q.get("labelSelector").cloned().unwrap_or_default();
                let (rv, items) = self.with(|s| {
                    let items: Vec<Value> = s
                        .objects
                        .get(&coll)
                        .map(|m| {
                            m.values()
                                .filter(|o| selector_matches(&sel, o))
                                .cloned()
                                .collect()
                        })
                        .unwrap_or_default();
                    (s.rv, items)
                });
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
                )
            }
            ("GET", Some(n)) => match self.get(&coll, &n) {
                Some(o) => json_response(StatusCode::OK, &o),
                None => status(StatusCode::NOT_FOUND, "NotFound", &format!("{n} not found")),
            },
            ("POST", None) => {
                let mut object = body;
                let n = object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if self.get(&coll, &n).is_some() {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("{n} already exists"),
                    );
                }
                let ns = segments[base + 1];
                object["metadata"]["namespace"] = json!(ns);
                let created = self.with(|s| self.record(s, &coll, "ADDED", object));
                json_response(StatusCode::CREATED, &created)
            }
            ("PATCH", Some(n)) => {
                let result = self.with(|s| {
                    let Some(mut current) = s.objects.get(&coll).and_then(|m| m.get(&n)).cloned() else {
                        return Err(Box::new(status(StatusCode::NOT_FOUND, "NotFound", &format!("{n} not found"))));
                    };
                    let holder = current["spec"]["holderIdentity"].as_str().map(str::to_owned);
                    let wanted = body["spec"]["holderIdentity"].as_str();
                    if content_type.starts_with("application/apply-patch")
                        && wanted.is_some()
                        && holder.is_some()
                        && holder.as_deref() != wanted
                    {
                        return Err(Box::new(status(StatusCode::CONFLICT, "Conflict", "Apply failed with 1 conflict: conflict with another manager: .spec.holderIdentity")));
                    }
                    merge(&mut current, &body);
                    Ok(self.record(s, &coll, "MODIFIED", current))
                });
                match result {
                    Ok(o) => json_response(StatusCode::OK, &o),
                    Err(r) => *r,
                }
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "not in the mock",
            ),
        }
    }

    /// A watch stream: the changes after `since`, then every new one, as JSON lines.
    fn watch(&self, coll: String, since: u64, selector: String) -> Response<Body> {
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let (backlog, mut live) = self.with(|s| {
            let backlog: Vec<Change> = s.history.iter().filter(|c| c.rv > since).cloned().collect();
            (backlog, self.changes.subscribe())
        });
        let line =
            |c: &Change| Bytes::from(format!("{}\n", json!({"type": c.kind, "object": c.object})));
        tokio::spawn(async move {
            for c in backlog
                .iter()
                .filter(|c| c.collection == coll && selector_matches(&selector, &c.object))
            {
                if tx.send(line(c)).is_err() {
                    return;
                }
            }
            let last = backlog.last().map(|c| c.rv).unwrap_or(since);
            while let Ok(c) = live.recv().await {
                if c.rv > last
                    && c.collection == coll
                    && selector_matches(&selector, &c.object)
                    && tx.send(line(&c)).is_err()
                {
                    return;
                }
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(BodyExt::boxed_unsync(StreamBody::new(stream)))
            .unwrap()
    }
}

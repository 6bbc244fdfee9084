//! The HTTP server: `/metrics`, the JSON API and `/healthz`.
//!
//! | path                 | answer                                                  |
//! |----------------------|---------------------------------------------------------|
//! | `/metrics`           | Prometheus metrics ([`crate::metrics`]; OpenMetrics when the `Accept` header asks for it, text 0.0.4 otherwise) |
//! | `/api/v1/snapshot`   | the whole [`AgentSnapshot`]                             |
//! | `/api/v1/processes`  | `[ProcessReport]`; `?pid=N` filters                     |
//! | `/api/v1/instances`  | `[{pid, comm, …InstanceReport}]`; `?pid=N` filters      |
//! | `/api/v1/storms`     | `[StormReport]`, oldest first; `?pid=N`, `?since=ID` (ids above ID) filter |
//! | `/api/v1/storms/{id}` | one storm with its timeline ([`StormDetail`]); 404 when not kept |
//! | `/healthz`           | `ok scans=N`, or 503 when the scan thread stopped publishing |
//! | `/debug/pprof/mutex` | gzipped pprof: waits by the holder's call site ([`crate::pprof`]); `?seconds=N` (1..=300) answers the delta over the next N seconds |
//! | `/debug/pprof/block` | the same by the waiter's call site                       |
//!
//! Every answer is rendered from the latest snapshot the source returns.
//! Unknown paths answer 404 and bad queries 400, with a JSON
//! `{"error": …}` body.
//!
//! With a bearer token ([`ServeOptions::auth`]) every request but
//! `/healthz` must carry `Authorization: Bearer <token>`; without it the
//! answer is 401 with a plain-text body. `/healthz` stays open so that a
//! liveness check needs no secret (it tells only the scan count).
//!
//! The caller chooses the address (loopback by default: which interface to
//! expose is the CLI's decision, never this module's); [`bind`] binds TCP
//! or a unix socket of mode 0600.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::auth::BearerToken;
use crate::client::AgentAddr;
use crate::metrics::{self, Format, MetricsOptions};
use crate::model::{AgentSnapshot, InstanceReport, ProcessReport, StormDetail, StormReport};

/// Where the server gets the latest snapshot.
pub type SnapshotSource = Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync>;

/// A snapshot older than this makes `/healthz` answer 503: the scan thread
/// publishes several times a second, so this means it is stuck.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// How long in-flight requests may take to finish after shutdown was
/// signalled before [`serve`] returns anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The source, taken away when [`serve`] returns so connections that outlive
/// it hold no reference to what the source captured.
#[derive(Clone)]
struct AppState(Arc<RwLock<Option<SnapshotSource>>>, MetricsOptions);

impl AppState {
    fn snapshot(&self) -> Result<Arc<AgentSnapshot>, ApiError> {
        let source = self.0.read().clone();
        match source {
            Some(source) => Ok(source()),
            None => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, "shutting down".into())),
        }
    }
}

/// An error answered as `{"error": message}` with its status.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct ErrorBody {
            error: String,
        }
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// The router serving every endpoint from `source`.
pub fn router(source: SnapshotSource) -> Router {
    router_with_state(
        AppState(Arc::new(RwLock::new(Some(source))), MetricsOptions::default()),
        None,
    )
}

fn router_with_state(state: AppState, auth: Option<BearerToken>) -> Router {
    let router = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/api/v1/snapshot", get(api_snapshot))
        .route("/api/v1/processes", get(api_processes))
        .route("/api/v1/instances", get(api_instances))
        .route("/api/v1/storms", get(api_storms))
        .route("/api/v1/storms/{id}", get(api_storm))
        .route("/debug/pprof/mutex", get(pprof_mutex))
        .route("/debug/pprof/block", get(pprof_block))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    match auth {
        None => router,
        Some(token) => router.layer(axum::middleware::from_fn_with_state(
            Arc::new(token),
            require_token,
        )),
    }
}

/// The path a liveness check may ask without the token.
const OPEN_PATH: &str = "/healthz";

/// The plain-text body of a 401.
pub const UNAUTHORIZED_BODY: &str =
    "unauthorized: this agent wants `Authorization: Bearer <token>`, the token in its --auth-token-file\n";

/// Lets a request through when it carries `token` (or asks for [`OPEN_PATH`]).
async fn require_token(State(token): State<Arc<BearerToken>>, request: Request, next: Next) -> Response {
    let authorised = request.uri().path() == OPEN_PATH
        || request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| token.accepts(value));
    if authorised {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [
            (
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"subetha\""),
            ),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
        ],
        UNAUTHORIZED_BODY,
    )
        .into_response()
}

/// What [`serve_with`] does beyond serving the endpoints.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// How `/metrics` renders.
    pub metrics: MetricsOptions,
    /// The bearer token every request but `/healthz` must carry.
    pub auth: Option<BearerToken>,
}

/// A bound listener: TCP, or a unix socket (removed when [`serve`]
/// returns, if it is still the one bound).
#[derive(Debug)]
pub enum Listener {
    /// A TCP listener.
    Tcp(tokio::net::TcpListener),
    /// A unix socket listener and its path.
    Unix(tokio::net::UnixListener, UnixSocketFile),
}

impl From<tokio::net::TcpListener> for Listener {
    fn from(listener: tokio::net::TcpListener) -> Self {
        Self::Tcp(listener)
    }
}

/// The file of a bound unix socket: its path and inode, so that only this
/// socket is removed, never one another agent bound since.
#[derive(Debug)]
pub struct UnixSocketFile {
    path: std::path::PathBuf,
    inode: (u64, u64),
}

impl UnixSocketFile {
    fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `addr`. A unix socket gets mode 0600 before it is reachable (it is
/// bound under a temporary name, chmodded, then renamed into place); a
/// socket file left by an agent that is gone is replaced, one that answers
/// is refused.
pub async fn bind(addr: &AgentAddr) -> anyhow::Result<Listener> {
    match addr {
        AgentAddr::Tcp(addr) => Ok(Listener::Tcp(tokio::net::TcpListener::bind(addr).await?)),
        AgentAddr::Unix(path) => bind_unix(path),
    }
}

fn bind_unix(path: &std::path::Path) -> anyhow::Result<Listener> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!("{} exists and is not a socket", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use: something answers on it", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let name = path.file_name().context("a unix socket path needs a file name")?;
    let mut temporary = name.to_os_string();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = path.with_file_name(temporary);
    let _ = std::fs::remove_file(&temporary);
    let listener = tokio::net::UnixListener::bind(&temporary)?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(error.into());
    }
    let meta = std::fs::symlink_metadata(path)?;
    Ok(Listener::Unix(
        listener,
        UnixSocketFile {
            path: path.to_path_buf(),
            inode: (meta.dev(), meta.ino()),
        },
    ))
}

/// Serves [`router`] on `listener` until `shutdown` completes, then lets
/// in-flight requests finish (at most [`SHUTDOWN_GRACE`]) and returns. When
/// it returns, the server holds no clone of `source` any more.
pub async fn serve(
    listener: impl Into<Listener>,
    source: SnapshotSource,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(listener, source, ServeOptions::default(), shutdown).await
}

/// [`serve`] with `options`.
pub async fn serve_with(
    listener: impl Into<Listener>,
    source: SnapshotSource,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with_grace(listener.into(), source, options, shutdown, SHUTDOWN_GRACE).await
}

async fn serve_with_grace(
    listener: Listener,
    source: SnapshotSource,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> anyhow::Result<()> {
    let state = AppState(Arc::new(RwLock::new(Some(source))), options.metrics);
    let app = router_with_state(state.clone(), options.auth);
    let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
    let signal = async move {
        shutdown.await;
        let _ = stopping_tx.send(true);
    };
    let deadline = async move {
        if stopping_rx.wait_for(|stopping| *stopping).await.is_err() {
            // The server ended before shutdown was signalled.
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(grace).await;
    };
    let (server, socket_file) = match listener {
        Listener::Tcp(listener) => (
            Box::pin(async move { axum::serve(listener, app).with_graceful_shutdown(signal).await })
                as std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
            None,
        ),
        Listener::Unix(listener, file) => (
            Box::pin(async move { axum::serve(listener, app).with_graceful_shutdown(signal).await })
                as std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
            Some(file),
        ),
    };
    let result = tokio::select! {
        result = server => result.context("HTTP server failed"),
        () = deadline => {
            tracing::warn!(?grace, "HTTP requests still in flight at shutdown; not waiting for them");
            Ok(())
        }
    };
    state.0.write().take();
    if let Some(file) = socket_file {
        file.remove();
    }
    result
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no such endpoint: {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed (use GET)".into(),
    )
}

async fn index() -> &'static str {
    "subetha-agent\n\
     /metrics            Prometheus metrics\n\
     /api/v1/snapshot    everything the agent knows (JSON)\n\
     /api/v1/processes   instrumented processes (JSON; ?pid=N)\n\
     /api/v1/instances   instances of all processes (JSON; ?pid=N)\n\
     /api/v1/storms      drop storms (JSON; ?pid=N&since=ID)\n\
     /api/v1/storms/ID   one storm with its timeline (JSON)\n\
     /healthz            liveness\n"
}

async fn metrics_handler(State(state): State<AppState>, headers: HeaderMap) -> ApiResult {
    let snapshot = state.snapshot()?;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let body = metrics::render_with(&snapshot, format, state.1)
        .map_err(|_| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics".into()))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        )],
        body,
    )
        .into_response())
}

async fn healthz(State(state): State<AppState>) -> ApiResult {
    let snapshot = state.snapshot()?;
    let taken = snapshot.agent.taken_mono_ns;
    let age = Duration::from_nanos(subetha_core::clock::monotonic_ns().saturating_sub(taken));
    // taken == 0: nothing published yet (starting).
    if taken != 0 && age > STALE_AFTER {
        let body = format!(
            "stale: last snapshot {:.1} s ago, scans={}\n",
            age.as_secs_f64(),
            snapshot.agent.scans
        );
        return Ok((StatusCode::SERVICE_UNAVAILABLE, body).into_response());
    }
    Ok(format!("ok scans={}\n", snapshot.agent.scans).into_response())
}

/// Query filters of the list endpoints.
#[derive(Debug, Default, Deserialize)]
struct Filter {
    pid: Option<u32>,
    since: Option<u64>,
}

impl Filter {
    fn from_query(query: Result<Query<Filter>, QueryRejection>) -> Result<Self, ApiError> {
        query
            .map(|Query(filter)| filter)
            .map_err(|rejection| ApiError(StatusCode::BAD_REQUEST, rejection.body_text()))
    }

    fn pid(&self, pid: u32) -> bool {
        self.pid.is_none_or(|p| p == pid)
    }
}

/// `?seconds=N` of the pprof endpoints.
#[derive(Deserialize)]
struct ProfileQuery {
    seconds: Option<u64>,
}

/// Longest `?seconds=` window.
const MAX_PROFILE_SECONDS: u64 = 300;

async fn pprof_mutex(
    State(state): State<AppState>,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> ApiResult {
    pprof_answer(state, query, crate::pprof::ProfileKind::Mutex).await
}

async fn pprof_block(
    State(state): State<AppState>,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> ApiResult {
    pprof_answer(state, query, crate::pprof::ProfileKind::Block).await
}

async fn pprof_answer(
    state: AppState,
    query: Result<Query<ProfileQuery>, QueryRejection>,
    kind: crate::pprof::ProfileKind,
) -> ApiResult {
    use crate::pprof;
    let Query(query) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let start_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let (samples, duration_ns) = match query.seconds {
        None | Some(0) => (pprof::samples(&*state.snapshot()?, kind), 0),
        Some(seconds) if seconds <= MAX_PROFILE_SECONDS => {
            let before = pprof::samples(&*state.snapshot()?, kind);
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let after = pprof::samples(&*state.snapshot()?, kind);
            (pprof::delta(&before, &after), (seconds * 1_000_000_000) as i64)
        }
        Some(seconds) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("seconds={seconds}: at most {MAX_PROFILE_SECONDS}"),
            ));
        }
    };
    let body = pprof::encode_gzip(&pprof::profile(&samples, start_ns, duration_ns));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile.pb.gz\""),
            ),
        ],
        body,
    )
        .into_response())
}

async fn api_snapshot(State(state): State<AppState>) -> ApiResult {
    Ok(Json(&*state.snapshot()?).into_response())
}

async fn api_processes(
    State(state): State<AppState>,
    query: Result<Query<Filter>, QueryRejection>,
) -> ApiResult {
    let filter = Filter::from_query(query)?;
    let snapshot = state.snapshot()?;
    let processes: Vec<&ProcessReport> = snapshot.processes.iter().filter(|p| filter.pid(p.pid)).collect();
    Ok(Json(processes).into_response())
}

/// An instance with its process.
#[derive(Serialize)]
struct InstanceEntry<'a> {
    pid: u32,
    comm: &'a str,
    #[serde(flatten)]
    instance: &'a InstanceReport,
}

async fn api_instances(
    State(state): State<AppState>,
    query: Result<Query<Filter>, QueryRejection>,
) -> ApiResult {
    let filter = Filter::from_query(query)?;
    let snapshot = state.snapshot()?;
    let instances: Vec<InstanceEntry<'_>> = snapshot
        .processes
        .iter()
        .filter(|p| filter.pid(p.pid))
        .flat_map(|p| {
            p.instances.iter().map(|instance| InstanceEntry {
                pid: p.pid,
                comm: &p.comm,
                instance,
            })
        })
        .collect();
    Ok(Json(instances).into_response())
}

async fn api_storms(
    State(state): State<AppState>,
    query: Result<Query<Filter>, QueryRejection>,
) -> ApiResult {
    let filter = Filter::from_query(query)?;
    let snapshot = state.snapshot()?;
    let storms: Vec<&StormReport> = snapshot
        .storms
        .iter()
        .filter(|s| filter.pid(s.pid) && filter.since.is_none_or(|since| s.id > since))
        .collect();
    Ok(Json(storms).into_response())
}

async fn api_storm(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id: u64 = id.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("bad storm id {id:?}: expected a number"),
        )
    })?;
    let snapshot = state.snapshot()?;
    let storm = snapshot.storms.iter().find(|s| s.id == id).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "no storm {id}: the agent keeps the newest {} (see /api/v1/storms)",
                snapshot.storms.len()
            ),
        )
    })?;
    Ok(Json(StormDetail {
        storm: storm.clone(),
        timeline: storm.timeline.as_deref().cloned(),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::sample;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        fn json(&self) -> serde_json::Value {
            assert_eq!(
                self.header("content-type"),
                Some("application/json"),
                "{}",
                self.body
            );
            serde_json::from_str(&self.body).unwrap()
        }
    }

    /// A minimal HTTP/1.1 client: one request per connection.
    async fn request(addr: std::net::SocketAddr, method: &str, target: &str, extra: &str) -> Reply {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("{method} {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_string(), v.trim().to_string())
            })
            .collect();
        let chunked = headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
        let body = if chunked { dechunk(body) } else { body.to_string() };
        Reply {
            status,
            headers,
            body,
        }
    }

    fn dechunk(mut rest: &str) -> String {
        let mut out = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                return out;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
    }

    #[tokio::test]
    async fn storm_detail_serves_the_timeline_the_snapshot_leaves_out() {
        use crate::model::{DropSample, RingDrops, StormTimeline};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut snapshot = sample();
        let timeline = StormTimeline {
            rings: vec![RingDrops {
                slot: 1,
                tid: 4243,
                thread_name: "worker-1".into(),
                storm_ring: true,
                samples: vec![DropSample {
                    at_mono_ns: 150,
                    dropped: 30,
                }],
            }],
            ..StormTimeline::default()
        };
        snapshot.storms[0].timeline = Some(Arc::new(timeline.clone()));
        let snapshot = Arc::new(snapshot);
        let source: SnapshotSource = Arc::new(move || Arc::clone(&snapshot));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, source, async move {
            let _ = stop_rx.await;
        }));

        let whole = request(addr, "GET", "/api/v1/snapshot", "").await;
        assert!(!whole.body.contains("timeline"), "{}", whole.body);
        let reply = request(addr, "GET", "/api/v1/storms/1", "").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let detail: StormDetail = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(detail.storm.id, 1);
        assert_eq!(detail.timeline, Some(timeline));
        let without = request(addr, "GET", "/api/v1/storms/2", "").await.json();
        assert_eq!(without["storm"]["id"], 2);
        assert!(without["timeline"].is_null());
        let unknown = request(addr, "GET", "/api/v1/storms/99", "").await;
        assert_eq!(unknown.status, 404);
        assert!(unknown.json()["error"].as_str().unwrap().contains("no storm 99"));
        let bad = request(addr, "GET", "/api/v1/storms/x1", "").await;
        assert_eq!(bad.status, 400);

        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn endpoints() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let snapshot = Arc::new(sample());
        let source: SnapshotSource = {
            let snapshot = Arc::clone(&snapshot);
            Arc::new(move || Arc::clone(&snapshot))
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, source, async move {
            let _ = stop_rx.await;
        }));

        let reply = request(addr, "GET", "/metrics", "").await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("content-type"),
            Some(metrics::PROMETHEUS_TEXT_CONTENT_TYPE)
        );
        assert!(
            reply.body.contains("\nsubetha_agent_scans_total 1234\n"),
            "{}",
            reply.body
        );
        let reply = request(
            addr,
            "GET",
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("content-type"),
            Some(metrics::OPENMETRICS_CONTENT_TYPE)
        );
        assert!(reply.body.ends_with("# EOF\n"));

        let reply = request(addr, "GET", "/api/v1/snapshot", "").await;
        assert_eq!(reply.status, 200);
        let back: AgentSnapshot = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(back, *snapshot);
        assert_eq!(reply.header("content-type"), Some("application/json"));

        let processes = request(addr, "GET", "/api/v1/processes", "").await.json();
        assert_eq!(processes.as_array().unwrap().len(), 1);
        assert_eq!(processes[0]["pid"], 4242);
        assert_eq!(processes[0]["rings"].as_array().unwrap().len(), 2);
        let none = request(addr, "GET", "/api/v1/processes?pid=1", "").await.json();
        assert_eq!(none.as_array().unwrap().len(), 0);

        let instances = request(addr, "GET", "/api/v1/instances?pid=4242", "")
            .await
            .json();
        let names: Vec<&str> = instances
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["state", "jobs"]);
        assert_eq!(instances[1]["pid"], 4242);
        assert_eq!(instances[1]["comm"], "app");
        assert_eq!(instances[1]["misses"], 7);

        let storms = request(addr, "GET", "/api/v1/storms", "").await.json();
        assert_eq!(storms.as_array().unwrap().len(), 3);
        let storms = request(addr, "GET", "/api/v1/storms?pid=4242&since=1", "")
            .await
            .json();
        let ids: Vec<u64> = storms
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [2]);

        let bad = request(addr, "GET", "/api/v1/storms?pid=abc", "").await;
        assert_eq!(bad.status, 400);
        assert!(bad.json()["error"].is_string());

        let reply = request(addr, "GET", "/healthz", "").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "ok scans=1234\n");

        let missing = request(addr, "GET", "/nope", "").await;
        assert_eq!(missing.status, 404);
        assert_eq!(missing.json()["error"], "no such endpoint: /nope");
        let post = request(addr, "POST", "/metrics", "Content-Length: 0\r\n").await;
        assert_eq!(post.status, 405);
        assert!(post.json()["error"].is_string());

        // Graceful shutdown: serve returns and drops the source.
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert_eq!(Arc::strong_count(&snapshot), 1);
    }

    fn token() -> BearerToken {
        BearerToken::parse("s3cret-token-0123456789", std::path::Path::new("/t")).unwrap()
    }

    #[tokio::test]
    async fn a_token_is_required_everywhere_but_healthz() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let source: SnapshotSource = Arc::new(|| Arc::new(sample()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let options = ServeOptions {
            auth: Some(token()),
            ..ServeOptions::default()
        };
        let server = tokio::spawn(serve_with(listener, source, options, async move {
            let _ = stop_rx.await;
        }));
        for path in [
            "/metrics",
            "/api/v1/snapshot",
            "/api/v1/storms/1",
            "/debug/pprof/mutex",
            "/nope",
        ] {
            let denied = request(addr, "GET", path, "").await;
            assert_eq!(denied.status, 401, "{path}: {}", denied.body);
            assert_eq!(denied.body, UNAUTHORIZED_BODY, "{path}");
            assert!(denied.header("content-type").unwrap().starts_with("text/plain"));
            assert!(denied.header("www-authenticate").unwrap().starts_with("Bearer"));
            let wrong = request(
                addr,
                "GET",
                path,
                "Authorization: Bearer s3cret-token-0123456780\r\n",
            )
            .await;
            assert_eq!(wrong.status, 401, "{path}");
            let basic = request(
                addr,
                "GET",
                path,
                "Authorization: Basic s3cret-token-0123456789\r\n",
            )
            .await;
            assert_eq!(basic.status, 401, "{path}");
        }
        let allowed = request(
            addr,
            "GET",
            "/metrics",
            "Authorization: Bearer s3cret-token-0123456789\r\n",
        )
        .await;
        assert_eq!(allowed.status, 200, "{}", allowed.body);
        assert!(allowed.body.contains("subetha_agent_scans_total"));
        let missing = request(
            addr,
            "GET",
            "/nope",
            "Authorization: Bearer s3cret-token-0123456789\r\n",
        )
        .await;
        assert_eq!(missing.status, 404);
        let health = request(addr, "GET", "/healthz", "").await;
        assert_eq!(health.status, 200, "/healthz stays open");
        // The client sends the token.
        let body = tokio::task::spawn_blocking(move || {
            let without = crate::client::get(addr, "/api/v1/snapshot").unwrap_err();
            assert!(format!("{without:#}").contains("401"), "{without:#}");
            crate::client::AgentClient::new(addr, Some(token()))
                .get("/api/v1/snapshot")
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(serde_json::from_str::<AgentSnapshot>(&body).unwrap(), sample());
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_unix_socket_is_private_and_removed_at_shutdown() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("subetha-http-unix-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("http.sock");
        // A stale socket file (nobody answers) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let addr = AgentAddr::Unix(path.clone());
        let listener = bind(&addr).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary name left"
        );
        let busy = bind(&addr).await.unwrap_err();
        assert!(busy.to_string().contains("in use"), "{busy:#}");
        let source: SnapshotSource = Arc::new(|| Arc::new(sample()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, source, async move {
            let _ = stop_rx.await;
        }));
        let client_addr = addr.clone();
        let body = tokio::task::spawn_blocking(move || {
            crate::client::AgentClient::new(client_addr, None).get("/healthz")
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(body, "ok scans=1234\n");
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(!path.exists(), "the socket is removed at shutdown");
        std::fs::write(&path, "").unwrap();
        let not_socket = bind(&addr).await.unwrap_err();
        assert!(not_socket.to_string().contains("not a socket"), "{not_socket:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn healthz_reports_a_stuck_scanner() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut snapshot = sample();
        let now = subetha_core::clock::monotonic_ns();
        snapshot.agent.taken_mono_ns = now.saturating_sub(STALE_AFTER.as_nanos() as u64 * 2).max(1);
        let snapshot = Arc::new(snapshot);
        let source: SnapshotSource = Arc::new(move || Arc::clone(&snapshot));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, source, async move {
            let _ = stop_rx.await;
        }));
        let reply = request(addr, "GET", "/healthz", "").await;
        if now > STALE_AFTER.as_nanos() as u64 * 2 {
            assert_eq!(reply.status, 503, "{}", reply.body);
            assert!(reply.body.starts_with("stale: "));
        }
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn shutdown_does_not_wait_for_a_stalled_client() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let source: SnapshotSource = Arc::new(|| Arc::new(sample()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let grace = Duration::from_millis(200);
        let server = tokio::spawn(serve_with_grace(
            listener.into(),
            source,
            ServeOptions::default(),
            async move {
                let _ = stop_rx.await;
            },
            grace,
        ));
        // A client that never finishes its request headers.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
        let took = started.elapsed();
        assert!(took >= grace && took < grace + Duration::from_secs(2), "{took:?}");
    }
}

//! A loopback server speaking the Hub's download protocol, as hf-hub uses
//! it (point `HF_ENDPOINT` at it): the repo info listing its files, and
//! `resolve` answering `Range` requests with the `etag` and
//! `x-repo-commit` headers, for model and dataset repos.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

/// Files served for download: repo key → path → bytes. A model repo's key
/// is `org/name`, a dataset's `datasets/org/name`.
pub type Served = Arc<Mutex<HashMap<String, HashMap<String, Vec<u8>>>>>;

/// The key of `org/name` in [`Served`] for a dataset repo.
pub fn dataset_key(repo: &str) -> String {
    format!("datasets/{repo}")
}

/// Every request the server answered: method-less path (for tests that
/// check what was fetched).
pub type Log = Arc<Mutex<Vec<String>>>;

#[derive(Clone)]
struct Files {
    served: Served,
    log: Log,
}

pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn info(files: &Files, key: &str) -> Response {
    files.log.lock().unwrap().push(format!("info {key}"));
    let served = files.served.lock().unwrap();
    let Some(repo) = served.get(key) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "Repository not found"})),
        )
            .into_response();
    };
    let siblings: Vec<serde_json::Value> = repo.keys().map(|f| json!({"rfilename": f})).collect();
    Json(json!({"id": key, "sha": "5eed", "siblings": siblings})).into_response()
}

fn resolve(files: &Files, key: &str, file: &str, headers: &HeaderMap) -> Response {
    files.log.lock().unwrap().push(format!("get {key}/{file}"));
    let served = files.served.lock().unwrap();
    let Some(data) = served.get(key).and_then(|f| f.get(file)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("bytes=0-");
    let Some((start, end)) = range.trim_start_matches("bytes=").split_once('-') else {
        return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
    };
    let start: usize = start.parse().unwrap_or(0);
    let end: usize = if end.is_empty() {
        data.len().saturating_sub(1)
    } else {
        end.parse().unwrap_or(data.len().saturating_sub(1))
    };
    let body = data[start.min(data.len())..(end + 1).min(data.len())].to_vec();
    (
        StatusCode::PARTIAL_CONTENT,
        [
            ("etag", format!("\"{}\"", sha256_hex(data))),
            ("x-repo-commit", "5eed".to_string()),
            (
                "content-range",
                format!("bytes {start}-{end}/{}", data.len()),
            ),
        ],
        body,
    )
        .into_response()
}

type RepoPath = UrlPath<(String, String, String)>;
type FilePath = UrlPath<(String, String, String, String)>;

/// The download routes over `served`; requests are appended to `log`.
pub fn download_router(served: Served, log: Log) -> Router {
    let files = Files { served, log };
    Router::new()
        .route(
            "/api/models/{org}/{name}/revision/{rev}",
            get(
                |State(f): State<Files>, UrlPath((o, n, _)): RepoPath| async move {
                    info(&f, &format!("{o}/{n}"))
                },
            ),
        )
        .route(
            "/api/datasets/{org}/{name}/revision/{rev}",
            get(
                |State(f): State<Files>, UrlPath((o, n, _)): RepoPath| async move {
                    info(&f, &dataset_key(&format!("{o}/{n}")))
                },
            ),
        )
        .route(
            "/{org}/{name}/resolve/{rev}/{*file}",
            get(
                |State(f): State<Files>, h: HeaderMap, UrlPath((o, n, _, p)): FilePath| async move {
                    resolve(&f, &format!("{o}/{n}"), &p, &h)
                },
            ),
        )
        .route(
            "/datasets/{org}/{name}/resolve/{rev}/{*file}",
            get(
                |State(f): State<Files>, h: HeaderMap, UrlPath((o, n, _, p)): FilePath| async move {
                    resolve(&f, &dataset_key(&format!("{o}/{n}")), &p, &h)
                },
            ),
        )
        .with_state(files)
}

/// Serves `router` on a loopback port from a background thread; returns
/// its base address (`http://127.0.0.1:PORT`).
pub fn serve(router: Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, router).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

/// A download-only hub on loopback: its files, request log and address.
pub fn start() -> (Served, Log, String) {
    let served = Served::default();
    let log = Log::default();
    let base = serve(download_router(served.clone(), log.clone()));
    (served, log, base)
}

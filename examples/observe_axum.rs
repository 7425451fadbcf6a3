//! llmslo's observer mounted in a small axum gateway: every request goes on to one
//! OpenAI-compatible engine, the generation requests are measured on the way, and the
//! gateway serves the figures on `/metrics`.
//!
//! ```sh
//! cargo run --example observe_axum -- http://127.0.0.1:8000 127.0.0.1:8080
//! curl -N localhost:8080/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
//! curl -s localhost:8080/metrics | grep llmslo_time_to_first_token
//! ```

use axum::error_handling::HandleErrorLayer;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use llmslo::BoxBody;
use llmslo::{Measurement, MeasurementSettings, ObserveLayer, ObserveSettings};
use tower::ServiceBuilder;

/// The gateway: `/metrics`, and everything else observed on its way to `upstream` and recorded
/// into `measurement`'s readers.
pub fn app(upstream: Uri, measurement: &Measurement) -> Router {
    let client: Client<HttpConnector, BoxBody> = Client::builder(TokioExecutor::new()).build_http();
    // The engine client: any tower service whose response body streams will do.
    let forward = tower::service_fn(move |mut request: Request<BoxBody>| {
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        *request.uri_mut() = Uri::builder()
            .scheme(upstream.scheme_str().unwrap_or("http"))
            .authority(upstream.authority().expect("the upstream URI names a host").clone())
            .path_and_query(path)
            .build()
            .expect("an upstream and a request path make a URI");
        client.request(request)
    });
    let observed = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(|error: llmslo::BoxError| async move {
            (StatusCode::BAD_GATEWAY, format!("the engine failed: {error}"))
        }))
        .layer(ObserveLayer::new(
            measurement.recorder.clone(),
            ObserveSettings::default(),
        ))
        .service(forward);
    let metrics = measurement.metrics.clone();
    Router::new()
        .route("/metrics", get(move || async move { metrics.encode().into_response() }))
        .fallback_service(observed)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let upstream: Uri = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8000/".into())
        .parse()
        .expect("the first argument is the engine's URI");
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let measurement = Measurement::new(MeasurementSettings::default());
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .expect("the listen address is free");
    println!("observing {upstream} on http://{listen} (metrics on /metrics)");
    axum::serve(listener, app(upstream, &measurement))
        .await
        .expect("serving");
}

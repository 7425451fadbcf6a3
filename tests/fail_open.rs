//! A bad config file never stops the traffic: the sidecar forwards without it, says so on
//! `/metrics`, in the log and in `/readyz`'s body, and picks up a fixed file on its own.

use crate::common::process::SidecarProcess;
use crate::common::*;
use std::time::Duration;

/// Waits up to 10 s for `name` to read `value` on the process's `/metrics`.
async fn wait_for_gauge(sidecar: &SidecarProcess, name: &str, value: f64) -> String {
    let mut m = String::new();
    for _ in 0..100 {
        m = sidecar.scrape().await;
        if sample(&m, name, &[]) == value {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never read {value}:\n{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_slo_file_forwards_untouched_and_says_so_until_it_is_fixed() {
    let script = paced_capture(Duration::from_millis(5), Duration::from_millis(1));
    let expected: Vec<u8> = script.pieces.iter().flat_map(|(_, bytes)| bytes.clone()).collect();
    let (upstream, _) = scripted_upstream(script).await;
    let head = format!(
        "upstream: http://{upstream}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\ngpu:\n  enabled: false\n"
    );
    let slo =
        |objective: &str| format!("{head}slos:\n  - name: tpot-50ms\n    objective: {objective}\n    tpot: 50ms\n");
    // An objective over 100: the file is invalid.
    let sidecar = SidecarProcess::with_file(&slo("150"), "", None);

    let response = post(sidecar.proxy, "/v1/chat/completions", chat_body(8, true, true)).await;
    assert_eq!(response.status(), 200);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body, expected, "the stream reaches the client byte for byte");
    let m = wait_for_gauge(&sidecar, "llmslo_config_valid", 0.0).await;
    assert_eq!(sample(&m, "llmslo_config_last_reload_successful", &[]), 0.0);
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
        1.0,
        "still measured"
    );
    let mut readyz = (0, String::new());
    for _ in 0..100 {
        readyz = sidecar.get("/readyz").await;
        if readyz.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(readyz.0, 200, "an invalid config never makes the pod unready");
    assert!(readyz.1.contains("config file is invalid"), "{}", readyz.1);

    // Fixed: picked up on its own, SLOs in force.
    std::fs::write(sidecar.config_path(), slo("99")).unwrap();
    let m = wait_for_gauge(&sidecar, "llmslo_config_valid", 1.0).await;
    assert_eq!(sample(&m, "llmslo_config_last_reload_successful", &[]), 1.0);
    assert!(m.contains("slo=\"tpot-50ms\""), "{m}");
    assert!(sample(&m, "llmslo_config_last_reload_success_timestamp_seconds", &[]) > 1.7e9);

    // Broken again: the last good SLOs stay in force, the gauges say so.
    std::fs::write(sidecar.config_path(), slo("0")).unwrap();
    let m = wait_for_gauge(&sidecar, "llmslo_config_valid", 0.0).await;
    assert_eq!(sample(&m, "llmslo_config_last_reload_successful", &[]), 0.0);
    assert!(m.contains("slo=\"tpot-50ms\""), "{m}");
    let (status, _) = post_collect(sidecar.proxy, "/v1/chat/completions", chat_body(8, true, true)).await;
    assert_eq!(status, 200);
    sidecar.stop();
}

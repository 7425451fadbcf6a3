//! GPU telemetry on a machine without a GPU (every CI machine): the real NVML path is
//! absent, so `llmslo_gpu_up` is 0, no GPU series exist, and everything else works.

use crate::common::*;

#[tokio::test]
async fn without_nvml_gpu_up_is_0_and_the_rest_works() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    for library in ["libnvidia-ml.so.1", "/nonexistent/libnvidia-ml.so"] {
        let sidecar = start_sidecar(
            engine,
            &format!("gpu: {{library_path: \"{library}\", interval: 200ms}}\n"),
        )
        .await;
        let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, false)).await;
        assert_eq!(status, 200);
        let text = settled(&sidecar).await;
        assert!(text.contains("llmslo_gpu_up 0"), "{library}");
        assert!(!text.contains("llmslo_gpu_utilization_ratio{") && !text.contains("llmslo_gpu_sample_age_seconds"));
        assert_eq!(sample(&text, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
        sidecar.shutdown().await;
    }
}

#[tokio::test]
async fn gpu_disabled_exports_nothing_about_gpus() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "gpu: {enabled: false}\n").await;
    assert!(!sidecar.metrics.encode().contains("llmslo_gpu_"));
}

#[tokio::test]
async fn simulated_gpu_exports_every_series_without_nvml() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(
        engine,
        "gpu: {simulated: true, interval: 100ms, library_path: /nonexistent/libnvidia-ml.so}\n",
    )
    .await;
    let mut text = String::new();
    for _ in 0..50 {
        text = sidecar.metrics.encode();
        if sample(&text, "llmslo_gpu_up", &[]) == 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sample(&text, "llmslo_gpu_up", &[]), 1.0, "{text}");
    let labels = [("gpu", "0"), ("gpu_model", "llmslo simulated GPU")];
    let utilization = sample(&text, "llmslo_gpu_utilization_ratio", &labels);
    assert!((0.3..=0.9).contains(&utilization), "{utilization}");
    let watts = sample(&text, "llmslo_gpu_power_watts", &labels);
    assert!((70.0..=700.0).contains(&watts), "{watts}");
    assert_eq!(
        sample(&text, "llmslo_gpu_memory_total_bytes", &labels),
        80.0 * 1024.0 * 1024.0 * 1024.0
    );
    assert!(text.contains("llmslo_gpu_energy_joules_total{"));
    sidecar.shutdown().await;
}

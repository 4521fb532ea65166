//! The cross-check's settings: `upstream_metrics_url` schemes, interval and threshold bounds.

use tokenmeter::config::{load, ServeArgs, ServeConfig};

#[test]
fn metrics_url_schemes() {
    let mut c = ServeConfig {
        upstream: "http://10.0.0.5:8000/base".into(),
        ..Default::default()
    };
    assert_eq!(c.metrics_uri().unwrap(), None);
    c.upstream_metrics_url = Some(" ".into());
    assert_eq!(c.metrics_uri().unwrap(), None);
    c.upstream_metrics_url = Some("auto".into());
    let auto = c.metrics_uri().unwrap().unwrap();
    assert_eq!(auto.to_string(), "http://10.0.0.5:8000/metrics");
    c.upstream_metrics_url = Some("http://127.0.0.1:9/m".into());
    assert_eq!(c.metrics_uri().unwrap().unwrap().path(), "/m");
    c.upstream_metrics_url = Some("https://x/metrics".into());
    assert!(c.validate().is_err());
    c.upstream_metrics_url = None;
    c.metrics_scrape_interval_s = 0.0;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("metrics_scrape_interval_s"));
    c.metrics_scrape_interval_s = 1.0;
    c.disagreement_threshold_pct = f64::NAN;
    assert!(c.validate().is_err());
    let env = vec![(
        "TOKENMETER_UPSTREAM_METRICS_URL".to_string(),
        "auto".to_string(),
    )];
    let c = load(&ServeArgs::default(), env).unwrap();
    assert_eq!(c.metrics_scrape_interval_s, 10.0);
    assert_eq!(c.disagreement_threshold_pct, 5.0);
    assert!(c.metrics_uri().unwrap().is_some());
}

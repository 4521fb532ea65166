//! `/stats` on the proxy: fed by real traffic, protected by a token, movable to an admin address.

use std::time::Duration;

use crate::common::*;

#[tokio::test]
async fn stats_reflect_traffic_and_validate() {
    let up = FakeUpstream::start(vec![
        fixture("03_chat_stream_usage.http").script(Duration::from_millis(2))
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    for user in ["alice", "bob", "alice"] {
        let r = raw_request(
            proxy.addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"tiny-llama","stream":true}"#,
                &[("x-tokenmeter-user", user)],
            ),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let stats = raw_request(
        proxy.addr,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(stats.status, 200);
    let v = stats.json();
    assert_schema("stats.schema.json", &v);
    assert_eq!(v["schema"], 1);
    assert_eq!(v["totals"]["requests"], 3);
    assert_eq!(v["totals"]["completion_tokens"], 15);
    assert_eq!(v["users"]["alice"]["totals"]["requests"], 2);
    assert_eq!(v["in_flight"], 0);
    let one = raw_request(
        proxy.addr,
        b"GET /stats?user=bob&window=10s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .json();
    assert_schema("stats.schema.json", &one);
    assert!(one["users"].get("alice").is_none());
    assert_eq!(one["users"]["bob"]["totals"]["completion_tokens"], 5);
    let metrics = raw_request(
        proxy.addr,
        b"GET /stats/metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains("tokenmeter_completion_tokens_total{model=\"tiny-llama\",api=\"chat\"} 15"),
        "{text}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn stats_token_and_admin_listener() {
    let fx = fixture("00_models.http");
    let mut up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |c| {
        c.stats_token = Some(tokenmeter::config::Secret("s3cret".into()));
        c.admin_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let admin = proxy.handle.as_ref().unwrap().admin_addr().unwrap();
    let get = |auth: &str| {
        format!("GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}\r\n").into_bytes()
    };
    assert_eq!(raw_request(admin, &get("")).await.status, 401);
    assert_eq!(
        raw_request(admin, &get("authorization: Bearer nope\r\n"))
            .await
            .status,
        401
    );
    assert_eq!(
        raw_request(admin, &get("authorization: Bearer s3cret\r\n"))
            .await
            .status,
        200
    );
    // On admin_listen: the dashboard at / and tokenmeter's metrics at /metrics.
    let page = raw_request(
        admin,
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.body).contains("tokenmeter"));
    let metrics = raw_request(
        admin,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer s3cret\r\n\r\n",
    )
    .await;
    assert_eq!(metrics.status, 200);
    assert!(String::from_utf8_lossy(&metrics.body).contains("tokenmeter_requests_in_flight 0"));
    // On the main listener /stats now belongs to the upstream.
    let passed = raw_request(proxy.addr, &get("")).await;
    assert_eq!(passed.body, fx.body);
    assert!(up
        .seen
        .recv()
        .await
        .unwrap()
        .request_line()
        .starts_with("GET /stats "));
    proxy.stop().await;
}

/// vLLM refusing a bad request (404 unknown model) and the proxy refusing one itself (413) are
/// the client's faults: `client_error`, counted apart from the box's errors in the totals, the
/// window and Prometheus; a 500 is the server's.
#[tokio::test]
async fn client_faults_are_counted_apart_from_the_errors_of_the_box() {
    let server_error = "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let up = FakeUpstream::start(vec![
        fixture("e02_unknown_model.http").script(Duration::ZERO),
        Script {
            steps: vec![Step::Raw(Duration::ZERO, server_error.as_bytes().to_vec())],
        },
    ])
    .await;
    let time = tokenmeter::clock::TimeSource::manual();
    let proxy = TestProxy::start_with_time(&up.url(), time.clone(), |c| {
        c.max_request_body_bytes = 100;
    })
    .await;
    let chat = "/v1/chat/completions";
    let r = raw_request(proxy.addr, &post(chat, r#"{"model":"nope"}"#, &[])).await;
    assert_eq!(r.status, 404);
    let r = raw_request(proxy.addr, &post(chat, &"x".repeat(200), &[])).await;
    assert_eq!(r.status, 413);
    let r = raw_request(proxy.addr, &post(chat, r#"{"model":"m"}"#, &[])).await;
    assert_eq!(r.status, 500);
    // Close the second the three finished in, so the 10 s window holds it.
    time.advance(Duration::from_secs(2));
    let v = raw_request(
        proxy.addr,
        b"GET /stats?window=10s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .json();
    assert_schema("stats.schema.json", &v);
    let t = &v["totals"];
    assert_eq!(t["outcomes"]["client_error"], 2, "{t}");
    assert_eq!(t["outcomes"]["upstream_error"], 1, "{t}");
    assert_eq!(t["errors"], 1, "only the 500 is an error of the box: {t}");
    let w = &v["windows"]["10s"];
    assert_eq!(
        (&w["errors"], &w["client_errors"]),
        (&1.into(), &2.into()),
        "{w}"
    );
    let metrics = raw_request(
        proxy.addr,
        b"GET /stats/metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8(metrics.body).unwrap();
    for series in [
        "tokenmeter_requests_total{model=\"nope\",api=\"chat\",outcome=\"client_error\",status=\"4xx\"} 1",
        "tokenmeter_requests_total{model=\"m\",api=\"chat\",outcome=\"upstream_error\",status=\"5xx\"} 1",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    let lines = proxy.finish().await;
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["client_error", "client_error", "upstream_error"]);
}

/// The stats API's own 404 and 405 are JSON in its error shape, on the main listener (where
/// only `/stats*` is the proxy's) and on `admin_listen` alike.
#[tokio::test]
async fn stats_404_and_405_are_json_errors() {
    let up = FakeUpstream::start(vec![fixture("00_models.http").script(Duration::ZERO)]).await;
    let main = TestProxy::start(&up.url(), |_| {}).await;
    let with_admin = TestProxy::start(&up.url(), |c| {
        c.admin_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let admin = with_admin.handle.as_ref().unwrap().admin_addr().unwrap();
    for addr in [main.addr, admin] {
        let r = raw_request(
            addr,
            b"GET /stats/nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(r.status, 404);
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        let v = r.json();
        assert_eq!(v["error"]["type"], "NotFoundError", "{v}");
        assert_eq!(v["error"]["code"], 404);
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/stats/nope"));
        let r = raw_request(addr, &post("/stats", "{}", &[])).await;
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD"));
        let v = r.json();
        assert_eq!(v["error"]["type"], "MethodNotAllowedError", "{v}");
        assert_eq!(v["error"]["code"], 405);
    }
    let r = raw_request(
        admin,
        b"GET /nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!((r.status, &r.json()["error"]["code"]), (404, &404.into()));
    main.stop().await;
    with_admin.stop().await;
}

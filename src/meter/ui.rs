//! The live dashboard page: one HTML document with its CSS and script embedded in the binary,
//! so it loads nothing from the network (an air-gapped GPU box can show it). The script polls
//! `/stats` and draws with hand-written SVG.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page, assembled at compile time from `ui/dashboard.{html,css,js}`.
pub const PAGE: &str = concat!(
    include_str!("ui/head.html"),
    "<style>\n",
    include_str!("ui/dashboard.css"),
    "</style>\n",
    include_str!("ui/body.html"),
    "<script>\n",
    include_str!("ui/dashboard.js"),
    "</script>\n</body>\n</html>\n"
);

/// `GET /` on `admin_listen`, `GET /stats/ui` on the main listener.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page is the same for every build; no data in it, so any cache may keep it.
            (header::CACHE_CONTROL, "no-cache"),
            // Nothing but this document's own script and style, and fetches to this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src data:",
            ),
        ],
        PAGE,
    )
        .into_response()
}

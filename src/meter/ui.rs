//! The live dashboard page: one HTML document with its CSS and script embedded in the binary,
//! so it loads nothing from the network (an air-gapped GPU box can show it). The script polls
//! `/stats` and draws with hand-written SVG.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page, assembled at compile time from `ui/` (`head.html`, `dashboard.css`, `body.html`,
/// `dashboard.js`, `kv.js`).
pub const PAGE: &str = concat!(
    include_str!("ui/head.html"),
    "<style>\n",
    include_str!("ui/dashboard.css"),
    "</style>\n",
    include_str!("ui/body.html"),
    "<script>\n",
    include_str!("ui/dashboard.js"),
    include_str!("ui/kv.js"),
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

#[cfg(test)]
mod tests {
    use crate::record::Outcome;

    /// The page marks in red only the outcomes it lists as errors of the box: that list must be
    /// `Outcome::is_error`'s, or a client's own doing (load's deadline aborting its requests)
    /// reads as the server failing.
    #[test]
    fn the_page_marks_red_exactly_the_errors_of_the_box() {
        let js = include_str!("ui/dashboard.js");
        let line = js
            .lines()
            .find(|l| l.starts_with("const BOX_ERRORS = ["))
            .expect("BOX_ERRORS in dashboard.js");
        let listed: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        let errors: Vec<&str> = Outcome::ALL
            .iter()
            .filter(|o| o.is_error())
            .map(|o| o.as_str())
            .collect();
        assert_eq!(listed, errors);
        assert!(!listed.contains(&"client_aborted") && !listed.contains(&"client_error"));
    }
}

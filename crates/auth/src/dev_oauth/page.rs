//! The page a person sees when the authorization endpoint refuses the request their browser brought and sends
//! nothing back to the client: the [`OAuthError`] of the JSON body, as a small HTML page, when the request's
//! `Accept` prefers `text/html` to JSON (a browser's navigation does; an SDK's fetch, curl and a request with no
//! `Accept` do not, and keep the JSON).

use super::error::OAuthError;

/// The `Content-Type` of [`OAuthError::page`].
pub const PAGE_CONTENT_TYPE: &str = "text/html; charset=utf-8";
/// The `Content-Security-Policy` that goes with [`OAuthError::page`]: its own inline style, and nothing else loads,
/// runs, submits or frames it.
pub const PAGE_CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether an `Accept` value prefers `text/html` to `application/json` (RFC 9110 §12.5.1: each type takes the
/// quality of the most specific range that matches it). Equal qualities, `*/*` alone and no `Accept` at all keep
/// the JSON.
#[must_use]
pub fn prefers_html(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| quality(a, "text", "html") > quality(a, "application", "json"))
}

/// The quality `accept` gives `kind/sub`: that of its most specific matching range, 0 when none matches.
fn quality(accept: &str, kind: &str, sub: &str) -> f32 {
    let mut best: Option<(u8, f32)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let Some((k, s)) = parts.next().and_then(|m| m.trim().split_once('/')) else { continue };
        let specificity = match (k.trim(), s.trim()) {
            (k, s) if k.eq_ignore_ascii_case(kind) && s.eq_ignore_ascii_case(sub) => 2,
            (k, "*") if k.eq_ignore_ascii_case(kind) => 1,
            ("*", "*") => 0,
            _ => continue,
        };
        let q = parts
            .filter_map(|p| p.trim().split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)));
        let Some(q) = q else { continue };
        if best.is_none_or(|(spec, _)| specificity > spec) {
            best = Some((specificity, q));
        }
    }
    best.map_or(0.0, |(_, q)| q)
}

/// `s` safe in HTML text and attribute values.
fn escape(s: &str) -> String {
    mcpfleet_core::escape_markup(s.chars())
}

impl OAuthError {
    /// The refusal as a page a person can read: what was refused (the description, escaped) and what to do. It
    /// loads nothing and runs nothing; send it with [`PAGE_CONTENT_TYPE`] and [`PAGE_CSP`].
    #[must_use]
    pub fn page(&self) -> String {
        let code = escape(self.code.as_str());
        let description = escape(&self.description);
        format!(
            "<!doctype html>\n\
             <html lang=\"en\">\n\
             <head>\n\
             <meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>Sign-in refused: {code}</title>\n\
             <style>body{{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em}}</style>\n\
             </head>\n\
             <body>\n\
             <h1>Sign-in refused</h1>\n\
             <p>The development sign-in of this MCP server (<code>mcpfleet serve --auth dev</code>) refused the \
             request that brought you here, and sent no answer back to the application that made it:</p>\n\
             <p><strong>{description}</strong></p>\n\
             <p>OAuth error <code>{code}</code>.</p>\n\
             <p>Go back to the application and sign in again. If this page comes back, the application's request \
             is wrong: its developer can compare it with the dev sign-in's documentation (DEV-SIGN-IN.md).</p>\n\
             </body>\n\
             </html>\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev_oauth::ErrorCode;

    #[test]
    fn a_browser_navigation_prefers_html_and_clients_keep_json() {
        let chromium = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,\
                        */*;q=0.8,application/signed-exchange;v=b3;q=0.7";
        let firefox = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        for accept in [chromium, firefox, "text/*", "TEXT/HTML", "application/json;q=0.5, text/html"] {
            assert!(prefers_html(Some(accept)), "{accept}");
        }
        for accept in [
            None,
            Some("*/*"),
            Some("application/json"),
            Some("application/json, text/event-stream"),
            Some("text/html, application/json"),
            Some("text/html;q=0.5, */*"),
            Some("text/html;q=0, */*;q=0.1"),
            Some("text/html;q=2"),
            Some("text/html;q=x"),
            Some(""),
            Some("garbage"),
        ] {
            assert!(!prefers_html(accept), "{accept:?}");
        }
    }

    #[test]
    fn the_page_escapes_what_it_shows() {
        let e = OAuthError::new(
            ErrorCode::InvalidRequest,
            "the parameter <script>alert('x')</script>&\"y\" is given more than once",
        );
        let page = e.page();
        assert!(page.starts_with("<!doctype html>"), "{page}");
        assert!(page.contains("<title>Sign-in refused: invalid_request</title>"), "{page}");
        assert!(
            page.contains(
                "the parameter &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;y&quot; is given more than once"
            ),
            "{page}"
        );
        assert!(!page.contains("<script"), "{page}");
    }
}

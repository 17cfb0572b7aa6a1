//! RFC 9728 protected resource metadata, and the parameters every challenge carries.

use serde_json::{Value, json};

/// The public face of the protected resource: what `/.well-known/oauth-protected-resource` says, and what the
/// `WWW-Authenticate` challenges point to.
#[derive(Clone, Debug)]
pub struct ProtectedResource {
    /// The public URL of the MCP endpoint (`--resource-url`), e.g. `https://mcp.example.com/mcp`.
    pub resource: String,
    /// Issuer identifiers of the authorization servers clients should use.
    pub authorization_servers: Vec<String>,
    /// Every scope this resource understands: the endpoint's and every tool's.
    pub scopes_supported: Vec<String>,
    /// The scopes every request needs; the scope of a challenge without credentials.
    pub required_scopes: Vec<String>,
    /// The human-readable name of the resource (`resource_name`): the server's name.
    pub resource_name: String,
}

/// Splits `scheme://authority/path` into its origin and its path (`/` when empty). `None` for anything else.
#[must_use]
pub fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let scheme_len = url.len() - rest.len();
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || url.contains(['?', '#', ' ', '"', '\\']) {
        return None;
    }
    Some((&url[..scheme_len + authority.len()], path))
}

/// The well-known prefix of RFC 9728.
pub const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

impl ProtectedResource {
    /// Where the metadata of this resource lives (RFC 9728 §3.1: the well-known prefix inserted before the
    /// resource's path).
    #[must_use]
    pub fn metadata_url(&self) -> String {
        match split_url(&self.resource) {
            Some((origin, "/")) => format!("{origin}{WELL_KNOWN}"),
            Some((origin, path)) => format!("{origin}{WELL_KNOWN}{path}"),
            None => format!("{}{WELL_KNOWN}", self.resource.trim_end_matches('/')),
        }
    }

    /// The local paths that serve the metadata: the root form, `/mcp`, and the resource URL's own path.
    #[must_use]
    pub fn metadata_paths(&self) -> Vec<String> {
        let mut paths = vec![WELL_KNOWN.to_owned(), format!("{WELL_KNOWN}/mcp")];
        if let Some((_, path)) = split_url(&self.resource)
            && path != "/"
            && path != "/mcp"
        {
            paths.push(format!("{WELL_KNOWN}{path}"));
        }
        paths
    }

    /// The metadata document.
    #[must_use]
    pub fn document(&self) -> Value {
        json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "scopes_supported": self.scopes_supported,
            "bearer_methods_supported": ["header"],
            "resource_name": self.resource_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_url_inserts_the_well_known_prefix() {
        let r = |resource: &str| ProtectedResource {
            resource: resource.to_owned(),
            authorization_servers: vec![],
            scopes_supported: vec![],
            required_scopes: vec![],
            resource_name: "mcpfleet".to_owned(),
        };
        assert_eq!(
            r("https://mcp.example.com/mcp").metadata_url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            r("https://mcp.example.com").metadata_url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
        assert_eq!(r("https://a.example/team/mcp").metadata_paths().len(), 3);
        assert!(split_url("ftp://x/").is_none());
        assert!(split_url("https://x/mcp?q=1").is_none());
    }
}

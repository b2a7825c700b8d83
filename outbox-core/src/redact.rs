//! Connection URLs fit for logs and error messages: passwords never shown. Every store and
//! sink redacts its URLs with these.

/// `raw` with the password of its user-info part and any `password=` query parameter
/// replaced by `***`; `None` when `raw` is not a URL, so that the caller decides what an
/// unparsable value shows (a store shows nothing of it, a sink [`strip_userinfo`]).
pub fn redact_url(raw: &str) -> Option<String> {
    let mut url = url::Url::parse(raw).ok()?;
    if url.cannot_be_a_base() && raw.contains('@') {
        // `word:s3cr3t@host` parses as scheme `word` and an opaque path: no user-info part
        // to find the password in, so drop whatever stands before the `@`.
        return Some(strip_userinfo(raw));
    }
    if url.password().is_some() && url.set_password(Some("***")).is_err() {
        return Some(strip_userinfo(raw));
    }
    if has_password_parameter(&url) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    Some(url.to_string())
}

/// Whether `url` has a `password=` query parameter.
fn has_password_parameter(url: &url::Url) -> bool {
    url.query_pairs().any(|(k, _)| k == "password")
}

/// `raw` without its password, as [`redact_url_or_strip`] shows it, when it holds one (a
/// URL's user-info password or `password=` parameter, or what stands before the `@` of a value
/// that is no URL); otherwise `raw` as written, not as the URL parser would normalise it (for
/// showing configuration values the user wrote: `outbox-relay config`).
pub fn hide_password(raw: &str) -> std::borrow::Cow<'_, str> {
    let holds_one = match url::Url::parse(raw) {
        Ok(url) => {
            (url.cannot_be_a_base() && raw.contains('@'))
                || url.password().is_some()
                || has_password_parameter(&url)
        }
        Err(_) => raw.contains('@'),
    };
    if holds_one {
        redact_url_or_strip(raw).into()
    } else {
        raw.into()
    }
}

/// `raw` as an adapter shows it in messages and `Debug` output: [`redact_url`], or
/// [`strip_userinfo`] when `raw` does not parse as a URL. Never the password either way.
pub fn redact_url_or_strip(raw: &str) -> String {
    redact_url(raw).unwrap_or_else(|| strip_userinfo(raw))
}

/// What ends the error of a URL that does not parse: when what stands before its last `@` holds
/// a character URLs reserve, the likely cause, a user name or password holding it (`p@ss:w/rd`
/// makes the parser read `ss:w` as the host and port: "invalid port number"). Empty otherwise:
/// `app@db:99999` has a bad port, whatever its user.
pub fn reserved_characters_hint(raw: &str) -> &'static str {
    let userinfo = match (raw.find("://"), raw.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => &raw[scheme_end + 3..at],
        (None, Some(at)) => &raw[..at],
        _ => return "",
    };
    if userinfo.contains(['@', '/', '?', '#', '%']) && url::Url::parse(raw).is_err() {
        "; a user name or password holding `@`, `:`, `/`, `?`, `#` or `%` must be \
         percent-encoded (`@` as `%40`, `:` as `%3A`, `/` as `%2F`)"
    } else {
        ""
    }
}

/// Text-level redaction for values that do not parse as URLs: everything between `://` (or
/// the start) and the last `@` becomes `***`.
pub fn strip_userinfo(raw: &str) -> String {
    match (raw.find("://"), raw.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}***@{}", &raw[..scheme_end + 3], &raw[at + 1..])
        }
        (None, Some(at)) => format!("***@{}", &raw[at + 1..]),
        _ => raw.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unparsable_url_with_user_info_hints_at_percent_encoding() {
        let raw = "postgres://app:p@ss:w/rd@db:5432/app";
        assert!(redact_url(raw).is_none());
        assert!(reserved_characters_hint(raw).contains("`@` as `%40`"));
        assert_eq!(reserved_characters_hint("postgres://db:99999/app"), "");
        // A port out of range, with a plain user: no hint at passwords.
        assert_eq!(reserved_characters_hint("postgres://app@db:99999/app"), "");
        assert!(!reserved_characters_hint("postgres://app:pa/ss@db:5432/app").is_empty());
        // A URL that parses was read as written: its trouble is elsewhere (an option's value).
        let parsed = "postgres://app@db:5432/app?sslmode=verify-fulll";
        assert_eq!(reserved_characters_hint(parsed), "");
    }

    #[test]
    fn passwords_are_replaced_wherever_they_are() {
        assert_eq!(
            redact_url("postgres://app:s3cr3t@db:5432/app").as_deref(),
            Some("postgres://app:***@db:5432/app")
        );
        let shown = redact_url("mysql://app@db/app?password=s3cr3t&ssl-mode=required").unwrap();
        assert!(
            !shown.contains("s3cr3t") && shown.contains("ssl-mode=required"),
            "{shown}"
        );
        assert_eq!(
            redact_url("redis://cache:6379").as_deref(),
            Some("redis://cache:6379")
        );
        assert_eq!(redact_url("not a url"), None);
    }

    #[test]
    fn a_value_without_password_is_shown_as_written() {
        for (raw, shown) in [
            ("http://localhost:4566", "http://localhost:4566"),
            ("{aggregate_type}", "{aggregate_type}"),
            ("postgres://app:s3cr3t@db/app", "postgres://app:***@db/app"),
            ("amqp://mq?password=s3cr3t", "amqp://mq?password=***"),
            ("user:s3cr3t@broker:9092", "***@broker:9092"),
        ] {
            assert_eq!(hide_password(raw), shown, "{raw}");
        }
    }

    #[test]
    fn unparsable_values_lose_their_user_info() {
        assert_eq!(strip_userinfo("x://u:s3cr3t@h/p"), "x://***@h/p");
        assert_eq!(strip_userinfo("u:s3cr3t@h"), "***@h");
        assert_eq!(strip_userinfo("plain"), "plain");
    }

    #[test]
    fn any_value_is_shown_without_its_password() {
        assert_eq!(
            redact_url_or_strip("amqp://app:s3cr3t@mq:5672/%2f"),
            "amqp://app:***@mq:5672/%2f"
        );
        assert_eq!(redact_url_or_strip("not a url:s3cr3t@h"), "***@h");
        assert_eq!(redact_url_or_strip("not-a-scheme:s3cr3t@h"), "***@h");
        assert_eq!(
            redact_url_or_strip("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
        assert_eq!(
            redact_url_or_strip("postgres://app:s3cr3t@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redact_url_or_strip("redis://:s3cr3t@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redact_url_or_strip("postgres://app@db/app"),
            "postgres://app@db/app"
        );
        for raw in ["not a url:s3cr3t@db", "postgres://app:s3cr3t@"] {
            assert!(
                !redact_url_or_strip(raw).contains("s3cr3t"),
                "{raw} -> {}",
                redact_url_or_strip(raw)
            );
        }
    }
}

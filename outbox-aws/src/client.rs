//! The SDK configuration of an AWS sink: the standard AWS chain (credentials, region, profile,
//! endpoint), the sink's `region`, `profile` and `endpoint` keys winning over it, and its
//! timeouts and retries. Credentials are never configuration keys, so they never sit in a relay
//! configuration file or its logs.

use std::time::Duration;

use aws_config::{Region, SdkConfig};
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use outboxkit_core::plugin::parse_url_setting;
use outboxkit_core::{Error, Result};

/// The keys of a sink's section that configure its AWS client, borrowed from its config type.
#[derive(Debug, Clone, Copy)]
pub struct ClientSettings<'a> {
    /// The sink's section, for errors (`sink.sqs`).
    pub section: &'static str,
    /// The service's own endpoint variable of the AWS chain (`AWS_ENDPOINT_URL_SQS`).
    pub endpoint_env: &'static str,
    pub endpoint: Option<&'a str>,
    pub region: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub retry_attempts: u32,
}

impl ClientSettings<'_> {
    /// Check the keys; errors name them (`sink.sqs.endpoint: ...`).
    pub fn validate(&self) -> Result<()> {
        let section = self.section;
        if let Some(endpoint) = self.endpoint {
            parse_url_setting(
                &format!("{section}.endpoint"),
                endpoint,
                &redact_url(endpoint),
                &["http", "https"],
                " (expected e.g. http://127.0.0.1:4566)",
            )?;
        }
        if let Some(region) = self.region {
            let valid = !region.is_empty()
                && region
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                return Err(Error::config(format!(
                    "{section}.region: `{region}` is not an AWS region name (e.g. us-east-1)"
                )));
            }
        }
        if self.profile.is_some_and(|p| p.trim().is_empty()) {
            return Err(Error::config(format!(
                "{section}.profile: must not be empty (leave it out for the default chain)"
            )));
        }
        if self.retry_attempts == 0 || self.retry_attempts > 10 {
            return Err(Error::config(format!(
                "{section}.retry_attempts: must be between 1 and 10, got {}",
                self.retry_attempts
            )));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(format!(
                    "{section}.{key}: must be longer than 0s"
                )));
            }
        }
        Ok(())
    }

    /// Load region, endpoint and credentials from the standard AWS chain (the `region` and
    /// `profile` keys win over it). Credentials are only looked at when a request is signed.
    pub async fn load_sdk_config(&self) -> SdkConfig {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = self.region {
            loader = loader.region(Region::new(region.to_owned()));
        }
        if let Some(profile) = self.profile {
            loader = loader.profile_name(profile);
        }
        loader.load().await
    }

    /// The region: the `region` key, else the SDK configuration's; an error naming the key
    /// when neither has one.
    pub fn region(&self, sdk_config: &SdkConfig) -> Result<String> {
        let section = self.section;
        self.region
            .map(str::to_owned)
            .or_else(|| sdk_config.region().map(|r| r.to_string()))
            .ok_or_else(|| {
                Error::config(format!(
                    "{section}.region: no AWS region configured: set {section}.region, \
                     or AWS_REGION, or a region in the AWS profile"
                ))
            })
    }

    /// Connect timeout and per-attempt timeout of every request.
    pub fn timeout_config(&self) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout)
            .operation_attempt_timeout(self.request_timeout)
            .build()
    }

    /// The SDK's standard retries, `retry_attempts` attempts per request.
    pub fn retry_config(&self) -> RetryConfig {
        RetryConfig::standard().with_max_attempts(self.retry_attempts)
    }

    /// The endpoint override as the SDK takes it.
    pub fn endpoint_url(&self) -> Option<&str> {
        self.endpoint.map(|e| e.trim_end_matches('/'))
    }

    /// Where the client sends, for messages: `us-east-1 at http://127.0.0.1:4566, set by
    /// sink.sqs.endpoint` (the endpoint key, else the chain's endpoint variables, without
    /// user-info, and which of them set it, so that an endpoint that cannot be reached says
    /// what to change), or the region.
    pub fn location(&self, region: &str) -> String {
        let key = format!("{}.endpoint", self.section);
        let endpoint = self.endpoint.map(|e| (redact_url(e), key)).or_else(|| {
            [self.endpoint_env, "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|var| {
                    let value = std::env::var(var).ok().filter(|v| !v.is_empty())?;
                    Some((redact_url(&value), (*var).to_owned()))
                })
        });
        match endpoint {
            Some((endpoint, set_by)) => format!("{region} at {endpoint}, set by {set_by}"),
            None => region.to_owned(),
        }
    }
}

/// Drop the user-info part (`user:password@`) of a URL.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if (!url.username().is_empty() || url.password().is_some())
                && (url.set_username("").is_err() || url.set_password(None).is_err())
            {
                return outboxkit_core::redact::strip_userinfo(raw);
            }
            url.to_string().trim_end_matches('/').to_owned()
        }
        Err(_) => outboxkit_core::redact::strip_userinfo(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ClientSettings<'static> {
        ClientSettings {
            section: "sink.test",
            endpoint_env: "AWS_ENDPOINT_URL_TEST",
            endpoint: None,
            region: None,
            profile: None,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            retry_attempts: 3,
        }
    }

    #[test]
    fn errors_name_the_key() {
        let bad = |s: ClientSettings<'static>| s.validate().unwrap_err().to_string();
        settings().validate().unwrap();
        let e = bad(ClientSettings {
            endpoint: Some("ftp://h"),
            ..settings()
        });
        assert!(
            e.starts_with("sink.test.endpoint: unsupported scheme"),
            "{e}"
        );
        let e = bad(ClientSettings {
            region: Some("EU"),
            ..settings()
        });
        assert!(e.starts_with("sink.test.region: "), "{e}");
        let e = bad(ClientSettings {
            retry_attempts: 11,
            ..settings()
        });
        assert!(e.starts_with("sink.test.retry_attempts: "), "{e}");
        let e = bad(ClientSettings {
            connect_timeout: Duration::ZERO,
            ..settings()
        });
        assert!(e.starts_with("sink.test.connect_timeout: "), "{e}");
    }

    #[test]
    fn locations_hide_user_info() {
        let s = ClientSettings {
            endpoint: Some("http://user:pw@127.0.0.1:4566/"),
            ..settings()
        };
        assert_eq!(
            s.location("eu-west-1"),
            "eu-west-1 at http://127.0.0.1:4566, set by sink.test.endpoint"
        );
        assert_eq!(s.endpoint_url(), Some("http://user:pw@127.0.0.1:4566"));
        assert_eq!(redact_url("not a url:s3cr3t@host"), "***@host");
    }
}

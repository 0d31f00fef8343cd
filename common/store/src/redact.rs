//! Redaction of secrets from text that came from the client library or the server, before it
//! reaches an error, a log or a metric. The secrets are the client's own: the AWS variables it
//! read credentials from.

/// Environment variables whose values never appear in Stoker's output.
const SECRET_VARIABLES: [&str; 3] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"];

/// `text` with every credential value of this process's environment replaced by `***`, and
/// cut to 300 characters (a server's error page is not a message).
pub(crate) fn redact(text: &str) -> String {
    let mut redacted = text.to_owned();
    for name in SECRET_VARIABLES {
        if let Ok(value) = std::env::var(name)
            && value.len() >= 4
        {
            redacted = redacted.replace(&value, "***");
        }
    }
    // Signed-request fragments some errors quote.
    for marker in ["Signature=", "X-Amz-Signature=", "Credential=", "X-Amz-Credential="] {
        while let Some(start) = redacted.find(marker) {
            let value_start = start + marker.len();
            let end = redacted[value_start..]
                .find(|c: char| c == '&' || c == ',' || c.is_whitespace())
                .map_or(redacted.len(), |at| value_start + at);
            redacted.replace_range(start..end, "[redacted]");
        }
    }
    if redacted.chars().count() > 300 {
        redacted = redacted.chars().take(300).collect::<String>() + "…";
    }
    redacted
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn signatures_are_cut_out_and_long_text_shortened() {
        let text = "GET http://h/b/k?X-Amz-Credential=AKIA/2026&X-Amz-Signature=abcdef failed";
        let redacted = redact(text);
        assert!(!redacted.contains("AKIA") && !redacted.contains("abcdef"), "{redacted}");
        assert!(redact(&"x".repeat(1000)).chars().count() <= 301);
    }
}

//! WebDataset brace patterns: `train-{000000..000127}.tar`, `{train,val}-{0..3}.tar`.
//!
//! Ranges keep the zero padding of their first bound; lists are comma-separated; several groups
//! expand as a cartesian product, left to right (as the `braceexpand` package does). Nested
//! braces are not supported and are reported as an error.

use crate::error::ShardError;

/// Most names one pattern may expand to (far more shards than any dataset has).
pub const MAX_EXPANSION: usize = 1_000_000;
/// Most bytes the names of one pattern may add up to. Checked before they are made: a short
/// pattern with a long literal part would otherwise ask for gigabytes within [`MAX_EXPANSION`].
pub const MAX_EXPANSION_BYTES: usize = 64 << 20;

/// Expand `pattern` into the names it denotes, in order.
pub fn expand(pattern: &str) -> Result<Vec<String>, ShardError> {
    let bad = |reason: &str| ShardError::BadPattern { pattern: pattern.to_string(), reason: reason.to_string() };
    let mut results = vec![String::new()];
    // Total length of `results`, kept to check the next product before it is made.
    let mut results_bytes = 0usize;
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map(|close| open + close).ok_or_else(|| bad("'{' without a matching '}'"))?;
        let body = &rest[open + 1..close];
        if body.contains('{') {
            return Err(bad("nested braces are not supported"));
        }
        let alternatives = alternatives(body).map_err(|reason| bad(&reason))?;
        let total = results.len().checked_mul(alternatives.len()).filter(|&total| total <= MAX_EXPANSION);
        if total.is_none() {
            return Err(bad(&format!("expands to more than {MAX_EXPANSION} names")));
        }
        let prefix = &rest[..open];
        let alternative_bytes = alternatives.iter().map(|alternative| prefix.len() + alternative.len()).sum::<usize>();
        results_bytes = results_bytes
            .checked_mul(alternatives.len())
            .and_then(|heads| heads.checked_add(results.len().checked_mul(alternative_bytes)?))
            .filter(|&total| total <= MAX_EXPANSION_BYTES)
            .ok_or_else(|| bad(&format!("expands to more than {MAX_EXPANSION_BYTES} bytes of names")))?;
        results =
            results.iter().flat_map(|head| alternatives.iter().map(move |alternative| format!("{head}{prefix}{alternative}"))).collect();
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err(bad("'}' without a matching '{'"));
    }
    if results
        .len()
        .checked_mul(rest.len())
        .and_then(|tails| tails.checked_add(results_bytes))
        .is_none_or(|total| total > MAX_EXPANSION_BYTES)
    {
        return Err(bad(&format!("expands to more than {MAX_EXPANSION_BYTES} bytes of names")));
    }
    for result in &mut results {
        result.push_str(rest);
    }
    Ok(results)
}

fn alternatives(body: &str) -> Result<Vec<String>, String> {
    if let Some((low, high)) = body.split_once("..") {
        let parse = |text: &str| text.parse::<u64>().map_err(|_| format!("range bound {text:?} is not a number"));
        let (low_value, high_value) = (parse(low)?, parse(high)?);
        if low_value > high_value {
            return Err(format!("range {body:?} runs backwards"));
        }
        if high_value - low_value >= MAX_EXPANSION as u64 {
            return Err(format!("range {body:?} has more than {MAX_EXPANSION} values"));
        }
        let width = if low.starts_with('0') && low.len() > 1 { low.len() } else { 0 };
        return Ok((low_value..=high_value).map(|value| format!("{value:0width$}")).collect());
    }
    if body.contains(',') {
        return Ok(body.split(',').map(str::to_string).collect());
    }
    Err(format!("{{{body}}} is neither a range (a..b) nor a list (a,b)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_keep_padding() {
        assert_eq!(expand("s-{000..002}.tar").ok(), Some(vec!["s-000.tar".into(), "s-001.tar".into(), "s-002.tar".into()]));
        assert_eq!(expand("{8..10}").ok(), Some(vec!["8".into(), "9".into(), "10".into()]));
    }

    #[test]
    fn groups_expand_as_a_product() {
        let expanded = expand("{a,b}-{0..1}.tar").unwrap_or_default();
        assert_eq!(expanded, vec!["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]);
        assert_eq!(expand("plain.tar").ok(), Some(vec!["plain.tar".into()]));
    }

    #[test]
    fn huge_expansions_are_refused_before_they_are_made() {
        // A million names is the limit; a long literal part makes fewer names too many bytes.
        assert_eq!(expand("{0..999999}").map(|names| names.len()).ok(), Some(MAX_EXPANSION));
        let long = "x".repeat(100);
        for pattern in
            [format!("{long}{{0..999999}}"), format!("{{0..999999}}{long}"), format!("{{0..999}}{long}{{0..999}}"), "{0..9999999}".into()]
        {
            let error = expand(&pattern).expect_err("too large");
            assert!(error.to_string().contains("more than"), "{error}");
        }
    }

    #[test]
    fn malformed_patterns_are_errors() {
        for pattern in ["a{0..", "a}b", "{5..1}", "{x..3}", "{a{b,c}}", "{abc}", "{0..99999999999}", "{0..9999}{0..9999}"] {
            assert!(expand(pattern).is_err(), "{pattern}");
        }
    }
}

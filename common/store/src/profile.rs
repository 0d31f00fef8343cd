//! Static credentials from the AWS shared files, as the AWS tools read them: the profile
//! `AWS_PROFILE` (else `default`) of `AWS_SHARED_CREDENTIALS_FILE` (else `~/.aws/credentials`)
//! and of `AWS_CONFIG_FILE` (else `~/.aws/config`, whose sections are `[profile NAME]`, except
//! `[default]`). Used only where the environment holds no access key: the variables come first,
//! as for the AWS CLI. Profiles that get credentials another way (`credential_process`, SSO,
//! `role_arn`) are not followed: the client falls back to web identity and the instance role.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Keys of one profile, as read. Never printed: `Debug` shows only which fields are there.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct ProfileCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token_opt: Option<String>,
    /// The profile's region, from either file.
    pub(crate) region_opt: Option<String>,
}

impl std::fmt::Debug for ProfileCredentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ProfileCredentials")
            .field("session_token", &self.session_token_opt.is_some())
            .field("region", &self.region_opt)
            .finish_non_exhaustive()
    }
}

/// The `key = value` pairs of section `wanted` of an INI text (`#` and `;` comments; keys in
/// lower case; indented lines, which continue a nested block such as `s3 =`, skipped).
fn section(text: &str, wanted: &str) -> HashMap<String, String> {
    let mut inside = false;
    let mut found = HashMap::new();
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            inside = name.trim() == wanted;
            continue;
        }
        if inside && let Some((key, value)) = line.split_once('=') {
            found.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    found
}

/// The credentials of `profile` in the texts of the credentials file and the config file.
pub(crate) fn parse(profile: &str, credentials_text: &str, config_text: &str) -> Option<ProfileCredentials> {
    let config_section = if profile == "default" { "default".to_owned() } else { format!("profile {profile}") };
    let from_credentials = section(credentials_text, profile);
    let from_config = section(config_text, &config_section);
    let value = |key: &str| from_credentials.get(key).or_else(|| from_config.get(key)).filter(|value| !value.is_empty()).cloned();
    Some(ProfileCredentials {
        access_key_id: value("aws_access_key_id")?,
        secret_access_key: value("aws_secret_access_key")?,
        session_token_opt: value("aws_session_token"),
        region_opt: from_config.get("region").or_else(|| from_credentials.get("region")).filter(|value| !value.is_empty()).cloned(),
    })
}

/// The credentials of the profile the environment names, where the environment has no access
/// key of its own and the files have one.
pub(crate) fn from_environment() -> Option<ProfileCredentials> {
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        return None;
    }
    let home_file = |name: &str| std::env::var_os("HOME").map(|home| Path::new(&home).join(".aws").join(name));
    let file = |variable: &str, name: &str| std::env::var_os(variable).map(PathBuf::from).or_else(|| home_file(name));
    let read = |path_opt: Option<PathBuf>| path_opt.and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default();
    let profile = std::env::var("AWS_PROFILE").ok().filter(|name| !name.is_empty()).unwrap_or_else(|| "default".to_owned());
    let credentials = read(file("AWS_SHARED_CREDENTIALS_FILE", "credentials"));
    let config = read(file("AWS_CONFIG_FILE", "config"));
    parse(&profile, &credentials, &config)
}

#[cfg(test)]
mod tests {
    use super::parse;

    const CREDENTIALS: &str = "\
# comment
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = secret/default

[training]
aws_access_key_id=AKIATRAINING
aws_secret_access_key=secret-training
aws_session_token = token-training
";

    const CONFIG: &str = "\
[default]
region = eu-west-1

[profile training]
region = us-west-2
s3 =
    endpoint_url = https://example.invalid
[profile sso]
sso_start_url = https://example.invalid/start
region = ap-south-1
";

    #[test]
    fn the_named_profile_gives_its_keys_and_its_config_region() {
        let training = parse("training", CREDENTIALS, CONFIG).expect("training");
        assert_eq!((training.access_key_id.as_str(), training.secret_access_key.as_str()), ("AKIATRAINING", "secret-training"));
        assert_eq!(training.session_token_opt.as_deref(), Some("token-training"));
        assert_eq!(training.region_opt.as_deref(), Some("us-west-2"), "from [profile training], the nested s3 block skipped");
        let default = parse("default", CREDENTIALS, CONFIG).expect("default");
        assert_eq!(
            (default.access_key_id.as_str(), default.session_token_opt, default.region_opt.as_deref()),
            ("AKIADEFAULT", None, Some("eu-west-1"))
        );
    }

    #[test]
    fn a_profile_without_static_keys_gives_none_and_keys_never_print() {
        assert_eq!(parse("sso", CREDENTIALS, CONFIG), None, "SSO profiles are not followed");
        assert_eq!(parse("missing", CREDENTIALS, CONFIG), None);
        let printed = format!("{:?}", parse("training", CREDENTIALS, CONFIG));
        assert!(!printed.contains("AKIA") && !printed.contains("secret") && !printed.contains("token-training"), "{printed}");
    }
}

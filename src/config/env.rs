//! `${NAME}` in a configuration file stands for environment variable NAME, so that
//! passwords can come from a Kubernetes Secret or a systemd credential while the file
//! itself lives in a ConfigMap. `$${` writes a literal `${`.

/// The text with every `${NAME}` replaced; a variable that is not set is an error
/// (a password silently empty would lock everyone out, or let everyone in).
pub fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut missing = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        if rest[..at].ends_with('$') {
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            missing.push("an unterminated ${ in the configuration".to_string());
            break;
        };
        let name = &after[..end];
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match lookup(name).filter(|_| valid) {
            Some(value) => out.push_str(&value),
            None if valid => {
                missing.push(format!("environment variable {name} (named as ${{{name}}}) is not set"))
            }
            None => missing.push(format!("\"${{{name}}}\" is not a variable name")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if missing.is_empty() { Ok(out) } else { Err(missing) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "APP_PASSWORD").then(|| "s3cret".to_string())
    }

    #[test]
    fn fills_in_variables_and_refuses_missing_ones() {
        assert_eq!(expand("password = \"${APP_PASSWORD}\"", env).unwrap(), "password = \"s3cret\"");
        assert_eq!(expand("a = \"$${APP_PASSWORD}\"", env).unwrap(), "a = \"${APP_PASSWORD}\"");
        assert_eq!(expand("no variables", env).unwrap(), "no variables");
        let err = expand("x = \"${NOPE}\" y = \"${bad-name}\" z = \"${", env).unwrap_err();
        assert_eq!(err.len(), 3, "{err:?}");
        assert!(err[0].contains("NOPE"));
    }
}

//! `${NAME}` in a configuration file's string values stands for environment variable
//! NAME, so that passwords can come from a Kubernetes Secret or a systemd credential
//! while the file itself lives in a ConfigMap. `$${` writes a literal `${`. Only values
//! are expanded, after the TOML is parsed: a comment may name a variable that is not
//! set, and a value with a quote or a newline cannot change the file's structure.

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

/// Expands every string value of `value`, at any depth.
pub fn expand_values(
    value: &mut toml::Value,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(), Vec<String>> {
    let mut missing = Vec::new();
    let mut each = |v: &mut toml::Value| {
        if let Err(more) = expand_values(v, lookup) {
            missing.extend(more);
        }
    };
    match value {
        toml::Value::String(text) => *text = expand(text, lookup)?,
        toml::Value::Array(items) => items.iter_mut().for_each(&mut each),
        toml::Value::Table(table) => table.iter_mut().for_each(|(_, v)| each(v)),
        _ => {}
    }
    if missing.is_empty() { Ok(()) } else { Err(missing) }
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

    #[test]
    fn only_values_are_expanded_and_cannot_change_the_structure() {
        let text =
            "# password = \"${UNSET_IN_A_COMMENT}\"\n[a]\nb = \"${QUOTED}\"\nc = [\"${APP_PASSWORD}\"]\n";
        let mut value: toml::Value = toml::from_str(text).unwrap();
        let lookup = |name: &str| match name {
            "QUOTED" => Some("x\"\n[admin]\ny = \"1".to_string()),
            other => env(other),
        };
        expand_values(&mut value, &lookup).unwrap();
        assert_eq!(value["a"]["b"].as_str(), Some("x\"\n[admin]\ny = \"1"), "one string, as set");
        assert_eq!(value["a"]["c"][0].as_str(), Some("s3cret"));
        assert!(value.get("admin").is_none());
    }
}

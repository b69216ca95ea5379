//! What `cargo xtask check-deploy` and the deploy suite both read from the
//! rendered manifests, in one place so that they read them alike.

/// `--flag=value` pairs of the server's container args, which start with
/// `serve`; every flag must use that form, so that patches and checks read
/// them alike.
pub fn server_flags(args: &[String]) -> Result<Vec<(String, String)>, String> {
    let Some((first, rest)) = args.split_first() else {
        return Err("no args".into());
    };
    if first != "serve" {
        return Err(format!("args must start with \"serve\", not {first:?}"));
    }
    rest.iter()
        .map(
            |a| match a.strip_prefix("--").and_then(|x| x.split_once('=')) {
                Some((k, v)) if !k.is_empty() => Ok((format!("--{k}"), v.to_owned())),
                _ => Err(format!("{a:?} is not --flag=value")),
            },
        )
        .collect()
}

//! Records the git revision the binary is built from, for `pgtenant --version`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown revision".into());
    println!("cargo:rustc-env=PGTENANT_GIT_REVISION={revision}");
    println!("cargo:rerun-if-changed=build.rs");
    // A new commit moves the branch HEAD names; a checkout moves HEAD itself. Only
    // files that exist are watched (a missing one would rebuild every time), and git
    // says where they are (a worktree's HEAD is not under ./.git).
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    for path in watched.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

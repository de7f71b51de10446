//! Configuration files for a tier binary's `serve`: a TOML file whose keys are the long flag names (`listen`,
//! `kv-memory-mb`, `model = [...]`). Precedence, highest first: command-line flags, `ZL_*` environment variables,
//! the file, built-in defaults. The file is turned into flags placed before the real ones, so clap does all
//! parsing and validation and reports errors in one format.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// The config file named by `--config FILE` / `--config=FILE` after `subcommand`, or by `ZL_CONFIG`.
fn config_path(argv: &[OsString], subcommand: usize) -> Option<PathBuf> {
    let mut args = argv.iter().skip(subcommand + 1);
    while let Some(arg) = args.next() {
        let s = arg.to_string_lossy();
        if s == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = s.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("ZL_CONFIG").map(PathBuf::from)
}

/// Insert the settings of the config file (if any) for `subcommand_name` into `argv`, right after the subcommand.
/// The file is named by `--config FILE` after the subcommand, or by `ZL_CONFIG`.
pub fn expand(cmd: &clap::Command, subcommand_name: &str, argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let Some(pos) = argv.iter().position(|a| a == subcommand_name) else { return Ok(argv) };
    let Some(path) = config_path(&argv, pos) else { return Ok(argv) };
    let sub = cmd.find_subcommand(subcommand_name).context("unknown subcommand")?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table = text.parse().with_context(|| format!("parsing config file {}", path.display()))?;
    let mut injected: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(key.as_str())) else {
            bail!(
                "{}: unknown setting {key:?} (settings are the long flags of `{} {subcommand_name}`)",
                path.display(),
                cmd.get_name()
            );
        };
        if key == "config" {
            bail!("{}: a config file cannot name another config file", path.display());
        }
        if arg.get_env().is_some_and(|env| std::env::var_os(env).is_some()) {
            continue; // the environment wins over the file
        }
        let scalar = |v: &toml::Value| -> Result<String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                other => bail!("{}: setting {key:?} has an unsupported value {other:?}", path.display()),
            }
        };
        match value {
            toml::Value::Array(items) => {
                for item in items {
                    injected.push(format!("--{key}").into());
                    injected.push(scalar(item)?.into());
                }
            }
            // A switch (`--flag`, no value): `true` sets it, `false` leaves it out.
            toml::Value::Boolean(true) if !arg.get_action().takes_values() => {
                injected.push(format!("--{key}").into());
            }
            toml::Value::Boolean(false) if !arg.get_action().takes_values() => {}
            other => {
                injected.push(format!("--{key}").into());
                injected.push(scalar(other)?.into());
            }
        }
    }
    let mut out = argv[..=pos].to_vec();
    out.extend(injected);
    out.extend_from_slice(&argv[pos + 1..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser, Subcommand};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Subcommand, Debug)]
    enum Cmd {
        #[command(args_override_self = true)]
        Serve {
            #[arg(long, default_value = "127.0.0.1:1")]
            listen: String,
            #[arg(long, env = "ZL_TEST_CONFIG_ONLY_ENV", default_value_t = 1)]
            size: u32,
            #[arg(long = "model")]
            models: Vec<String>,
            #[arg(long)]
            config: Option<PathBuf>,
            #[arg(long)]
            switch: bool,
        },
    }

    fn run(file: &str, args: &[&str]) -> Result<Cmd> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, file)?;
        let mut argv: Vec<OsString> = vec!["zl-worker".into(), "serve".into(), "--config".into(), path.clone().into()];
        argv.extend(args.iter().map(OsString::from));
        let argv = expand(&Cli::command(), "serve", argv)?;
        Ok(Cli::try_parse_from(argv)?.cmd)
    }

    #[test]
    fn file_values_apply_and_flags_override_them() {
        let Cmd::Serve { listen, size, models, .. } =
            run("listen = \"0.0.0.0:7\"\nsize = 5\nmodel = [\"a=x.gguf\", \"b=y\"]\n", &["--listen", "1.2.3.4:9"])
                .unwrap();
        assert_eq!(listen, "1.2.3.4:9");
        assert_eq!(size, 5);
        assert_eq!(models, vec!["a=x.gguf", "b=y"]);
    }

    #[test]
    fn switches_take_true_and_false() {
        let Cmd::Serve { switch, .. } = run("switch = true\n", &[]).unwrap();
        assert!(switch);
        let Cmd::Serve { switch, .. } = run("switch = false\n", &["--listen", "1.2.3.4:9"]).unwrap();
        assert!(!switch);
    }

    #[test]
    fn unknown_keys_and_bad_toml_are_clear_errors() {
        let err = run("listn = \"x\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("unknown setting \"listn\""), "{err}");
        let err = format!("{:#}", run("listen = \n", &[]).unwrap_err());
        assert!(err.contains("parsing config file"), "{err}");
    }
}

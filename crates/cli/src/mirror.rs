//! `braid mirror create|extend|resync|split|verify`: file-level mirrors as Lustre's
//! `lfs mirror` words them. Each `-N[COUNT]` begins the options of COUNT mirrors
//! (setstripe's, and `--flags=prefer`), read in order as `setstripe` reads its own.

use anyhow::{bail, Context, Result};
use client::mirror::MirrorSpec;
use client::FileKind;

use crate::stripe::{parse_setstripe, SetstripeAction};
use crate::tools::{creds, take_client_opts, with_client};
use crate::ClientOpts;

/// Usage of `braid mirror`, for its `--help`.
pub const MIRROR_HELP: &str = "\
File-level mirrors (FLR), as Lustre's lfs mirror: several copies of a file's bytes, each on its own OSTs.
A write goes to one mirror and marks the others stale; reads use an in-sync mirror, the preferred first,
and fall back to another when an OST is down.

  braid mirror create -N[COUNT] [STRIPE_OPTIONS] [--flags=prefer] [-N ...] FILE   a new, empty mirrored file
  braid mirror extend -N[COUNT] [STRIPE_OPTIONS] [--flags=prefer] [-N ...] FILE   add mirrors (a copy each)
  braid mirror resync FILE...                 copy in-sync bytes over the stale components
  braid mirror split --mirror-id ID [-d | -f NEW] FILE   take a mirror out: destroyed (-d), or kept as
                                              a file (NEW, by default FILE.mirror~ID); never the last in-sync copy
  braid mirror verify [-v] FILE...            compare the in-sync mirrors; fails if they differ

STRIPE_OPTIONS as braid setstripe's (-c N, -S SIZE, -p POOL, -o LIST, -E END ...), per mirror; unset ones
follow the file's first mirror. e.g. braid mirror create -N -p hot -N -p cool /mnt/braid/f
A command on a file open on another client is refused (run it again once it is closed).
Also: --secret-file FILE, --timeout-s SECONDS.";

/// The mirrors a `create` or `extend` asks for, and its file and client options.
#[derive(Debug, Clone)]
pub struct MirrorArgs {
    pub mirrors: Vec<MirrorSpec>,
    pub path: String,
    pub client: ClientOpts,
}

/// The count a `-N` argument gives (`-N`, `-N2`, `-N=2`, `--mirror-count=2`), if it is one.
fn mirror_count_arg(arg: &str) -> Option<Result<usize>> {
    let rest = arg.strip_prefix("--mirror-count").or_else(|| arg.strip_prefix("-N"))?;
    let n = rest.strip_prefix('=').unwrap_or(rest);
    Some(match n {
        "" => Ok(1),
        n => match n.parse::<usize>() {
            Ok(c) if (1..=client::mirror::MIRRORS_MAX).contains(&c) => Ok(c),
            _ => Err(anyhow::anyhow!("invalid mirror count '{n}' in {arg} (1 to {})", client::mirror::MIRRORS_MAX)),
        },
    })
}

/// Parses the arguments after `create` or `extend`.
pub fn parse_mirror_args(args: &[String]) -> Result<MirrorArgs> {
    let Some((path, opts)) = args.split_last().filter(|(p, _)| !p.starts_with('-')) else {
        bail!("braid mirror needs a file after its options (see braid mirror --help)");
    };
    // Each segment: its count, prefer, and setstripe's options.
    let mut segments: Vec<(usize, bool, Vec<String>)> = Vec::new();
    let mut it = opts.iter();
    while let Some(arg) = it.next() {
        if let Some(count) = mirror_count_arg(arg) {
            segments.push((count?, false, Vec::new()));
            continue;
        }
        let Some(seg) = segments.last_mut() else {
            bail!("'{arg}' comes before any -N: each mirror's options follow its -N");
        };
        let flags = match arg.strip_prefix("--flags") {
            Some(v) if v.starts_with('=') => Some(v[1..].to_string()),
            Some("") => Some(it.next().context("--flags needs a value (prefer)")?.clone()),
            _ => None,
        };
        match flags.as_deref() {
            Some("prefer") => seg.1 = true,
            Some(other) => bail!("unknown mirror flags '{other}' (prefer)"),
            None => seg.2.push(arg.clone()),
        }
    }
    if segments.is_empty() {
        bail!("braid mirror needs -N for each mirror (e.g. -N2, or -N -p hot -N -p cool)");
    }
    let mut mirrors = Vec::new();
    let mut client = ClientOpts { secret_file: None, timeout_s: 60 };
    for (count, prefer, mut opts) in segments {
        opts.push(path.clone());
        let s = parse_setstripe(&opts)?;
        let SetstripeAction::Set(layout) = s.action else {
            bail!("a mirror takes a layout (setstripe's options), not -d or component changes");
        };
        client.secret_file = s.secret_file.or(client.secret_file);
        client.timeout_s = s.timeout_s.unwrap_or(client.timeout_s);
        for _ in 0..count {
            mirrors.push(MirrorSpec { layout: layout.clone(), prefer });
        }
    }
    Ok(MirrorArgs { mirrors, path: path.clone(), client })
}

/// Runs `braid mirror ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    let Some((sub, rest)) = args.split_first() else { bail!("{MIRROR_HELP}") };
    match sub.as_str() {
        "create" | "extend" => {
            let m = parse_mirror_args(rest)?;
            with_client(&m.client, &m.path, |bc, p| {
                let c = creds();
                let client = &bc.client;
                let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
                let done = match sub.as_str() {
                    "create" => bc.run(client.mirror_create(&c, parent.fid, &name, 0o644, &m.mirrors)),
                    _ => bc.run(client.mirror_extend(&c, parent.fid, &name, &m.mirrors)),
                };
                done.map_err(|e| e.at(&p.url()))?;
                Ok(())
            })
        }
        "resync" => {
            let (opts, files) = take_client_opts(rest)?;
            if files.is_empty() || files.iter().any(|f| f.starts_with('-')) {
                bail!("braid mirror resync takes files (see braid mirror --help)");
            }
            for f in &files {
                on_file(&opts, f, |bc, c, parent, name| bc.run(bc.client.mirror_resync(c, parent, name)).map(|_| ()))?;
            }
            Ok(())
        }
        "split" => {
            let (opts, rest) = take_client_opts(rest)?;
            let (mut id, mut destroy, mut file, mut to) = (None, false, None, None);
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--mirror-id" => {
                        let v = it.next().context("--mirror-id needs a value")?;
                        id = Some(v.parse::<u16>().with_context(|| format!("invalid mirror id '{v}'"))?);
                    }
                    s if s.starts_with("--mirror-id=") => {
                        let v = &s["--mirror-id=".len()..];
                        id = Some(v.parse::<u16>().with_context(|| format!("invalid mirror id '{v}'"))?);
                    }
                    "-d" | "--destroy" => destroy = true,
                    "-f" | "--file" => to = Some(it.next().context("-f needs the new file's name")?.clone()),
                    s if s.starts_with('-') => bail!("unknown split option '{s}' (see braid mirror --help)"),
                    f => {
                        if file.replace(f.to_string()).is_some() {
                            bail!("braid mirror split takes one file");
                        }
                    }
                }
            }
            let id = id.context("braid mirror split needs --mirror-id ID")?;
            let file = file.context("braid mirror split needs a file")?;
            if destroy && to.is_some() {
                bail!("-d destroys the mirror, -f keeps it as a file: one or the other");
            }
            // Kept, by default beside the file as FILE.mirror~ID (Lustre's name).
            let to = (!destroy).then(|| to.unwrap_or_else(|| format!("{file}.mirror~{id}")));
            on_file(&opts, &file, |bc, c, parent, name| {
                let keep = match &to {
                    Some(t) => {
                        let p = crate::tools::cluster_path(t)
                            .map_err(|e| client::ClientError::Errno(client::Errno::Inval, e.to_string()))?;
                        let (dir, leaf) = bc.run(bc.client.resolve_parent(c, &p.path))?;
                        Some((dir.fid, leaf))
                    }
                    None => None,
                };
                let keep = keep.as_ref().map(|(d, l)| (*d, l.as_str()));
                bc.run(bc.client.mirror_split(c, parent, name, id, keep)).map(|_| ())
            })
        }
        "verify" => {
            let (opts, rest) = take_client_opts(rest)?;
            let verbose = rest.iter().any(|a| a == "-v" || a == "--verbose");
            let files: Vec<&String> = rest.iter().filter(|a| !(*a == "-v" || *a == "--verbose")).collect();
            if files.is_empty() || files.iter().any(|f| f.starts_with('-')) {
                bail!("braid mirror verify takes [-v] and files (see braid mirror --help)");
            }
            let mut differ = 0;
            for f in files {
                let report = on_file(&opts, f, |bc, c, parent, name| bc.run(bc.client.mirror_verify(c, parent, name)))?;
                for (at, a, b) in &report.differences {
                    println!("{f}: mirror {a} and mirror {b} differ at byte {at}");
                }
                if verbose || !report.differences.is_empty() {
                    let ids: Vec<String> = report.mirrors.iter().map(u16::to_string).collect();
                    println!(
                        "{f}: {} bytes of in-sync mirrors {} compared, {} chunk(s) differ",
                        report.bytes,
                        ids.join(","),
                        report.differences.len()
                    );
                }
                differ += report.differences.len();
            }
            if differ > 0 {
                bail!("mirrors differ");
            }
            Ok(())
        }
        "-h" | "--help" | "help" => {
            println!("{MIRROR_HELP}");
            Ok(())
        }
        other => bail!("unknown mirror command '{other}' (create, extend, resync, split, verify)"),
    }
}

/// Runs `op` on the file `path` names, with its parent's FID and its name.
fn on_file<T>(
    opts: &ClientOpts,
    path: &str,
    op: impl FnOnce(&client::BlockingClient, &client::Creds, client::Fid, &str) -> client::Result<T>,
) -> Result<T> {
    with_client(opts, path, |bc, p| {
        let c = creds();
        let a = bc.run(bc.client.resolve(&c, &p.path, false)).map_err(|e| e.at(&p.url()))?;
        if a.kind != FileKind::File {
            bail!("{}: mirrors are a regular file's", p.url());
        }
        let (parent, name) = bc.run(bc.client.resolve_parent(&c, &p.path))?;
        Ok(op(bc, &c, parent.fid, &name).map_err(|e| e.at(&p.url()))?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn each_n_begins_its_mirrors_options() {
        let m = parse_mirror_args(&args("-N -p hot -c 2 -N2 -p cool --flags=prefer f")).unwrap();
        assert_eq!(m.path, "f");
        assert_eq!(m.mirrors.len(), 3);
        assert_eq!(m.mirrors[0].layout.components[0].pool.as_deref(), Some("hot"));
        assert_eq!(m.mirrors[0].layout.components[0].stripe_count, Some(2));
        assert!(!m.mirrors[0].prefer && m.mirrors[1].prefer && m.mirrors[2].prefer);
        assert_eq!(m.mirrors[2].layout.components[0].pool.as_deref(), Some("cool"));
        assert_eq!(parse_mirror_args(&args("-N3 f")).unwrap().mirrors.len(), 3);
        assert_eq!(parse_mirror_args(&args("--mirror-count=2 f")).unwrap().mirrors.len(), 2);
    }

    #[test]
    fn bad_mirror_arguments_say_what_is_wrong() {
        let err = |s: &str| parse_mirror_args(&args(s)).unwrap_err().to_string();
        assert!(err("-p hot -N f").contains("before any -N"), "{}", err("-p hot -N f"));
        assert!(err("-N0 f").contains("invalid mirror count"));
        assert!(err("-N17 f").contains("invalid mirror count"));
        assert!(err("-N --flags=fast f").contains("unknown mirror flags"));
        assert!(err("-N -c x f").contains("stripe count"));
        assert!(parse_mirror_args(&args("-N -p")).is_err(), "no file");
        assert!(err("f").contains("needs -N"));
    }
}

//! `braid pool`: OST pools, with Lustre's `lctl pool_*` words and output.
//!
//! A pool is a named set of OSTs the MGS keeps and hands to every client and MDS
//! with the configuration; `braid setstripe -p POOL` (per component, or as a
//! directory's default) keeps a file's objects on the pool's OSTs. Run from inside a
//! mount, or with `--cluster braid://MGS/` (or `BRAID_CLUSTER`).

use std::io::Write;

use anyhow::{bail, Context, Result};
use proto::msg::{ClusterConfig, PoolOp};

use crate::tools::with_client;
use crate::ClientOpts;

/// What `braid pool` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolCommand {
    Create,
    Add,
    Remove,
    Destroy,
    List,
}

impl PoolCommand {
    pub fn parse(word: &str) -> Result<PoolCommand> {
        Ok(match word {
            "create" | "new" => PoolCommand::Create,
            "add" => PoolCommand::Add,
            "remove" => PoolCommand::Remove,
            "destroy" => PoolCommand::Destroy,
            "list" => PoolCommand::List,
            other => bail!("unknown pool command '{other}' (create, add, remove, destroy, list)"),
        })
    }
}

/// `FSNAME.POOL` as its two halves (a bare `FSNAME` for `list`).
fn split_name(name: &str) -> (&str, Option<&str>) {
    match name.split_once('.') {
        Some((fs, pool)) => (fs, Some(pool)),
        None => (name, None),
    }
}

/// OSTs as `lctl pool_add` takes them: `OST0003`, `FS-OST0003_UUID`, `OST[0-3]`,
/// or indices `0,2-3`.
pub fn parse_osts(args: &[String]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for a in args {
        let name = a.rsplit_once("-OST").map_or(a.as_str(), |(_, rest)| rest);
        let name = name.strip_prefix("OST").unwrap_or(name).trim_end_matches("_UUID");
        let indices = if let Some(range) = name.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            layout::parse_ost_list(range).with_context(|| format!("OSTs '{a}'"))?
        } else if name.len() == 4 && a.contains("OST") {
            vec![u32::from_str_radix(name, 16).with_context(|| format!("OST name '{a}': want OSTxxxx (hex)"))?]
        } else {
            layout::parse_ost_list(name).with_context(|| format!("OSTs '{a}'"))?
        };
        out.extend(indices);
    }
    Ok(out)
}

/// Runs `braid pool OP NAME [OST...]` against the cluster `cluster` names.
pub fn pool(opts: &ClientOpts, cluster: &str, cmd: PoolCommand, name: &str, osts: &[String]) -> Result<()> {
    let (fsname, pool) = split_name(name);
    // What the MGS is asked; `None` lists.
    let op = match cmd {
        PoolCommand::Create => Some(PoolOp::Create),
        PoolCommand::Add => Some(PoolOp::Add),
        PoolCommand::Remove => Some(PoolOp::Remove),
        PoolCommand::Destroy => Some(PoolOp::Destroy),
        PoolCommand::List => None,
    };
    let listed = parse_osts(osts)?;
    match (&cmd, pool, listed.is_empty()) {
        (PoolCommand::List, _, true) => {}
        (PoolCommand::List, _, false) => bail!("pool list takes no OSTs"),
        (_, None, _) => bail!("name the pool as FSNAME.POOL, e.g. {fsname}.hot"),
        (PoolCommand::Add | PoolCommand::Remove, _, true) => bail!("name the OSTs, e.g. OST0000 OST[1-3] or 0,2"),
        (PoolCommand::Create | PoolCommand::Destroy, _, false) => {
            bail!("pool create and destroy take no OSTs (use pool add and pool remove)")
        }
        _ => {}
    }
    with_client(opts, cluster, |bc, _| {
        let config = bc.client.config();
        if config.fsname != fsname {
            bail!("no file system '{fsname}' at {cluster}: it serves '{}'", config.fsname);
        }
        let Some(op) = op else { return print_list(&mut std::io::stdout().lock(), &config, pool) };
        let pool = pool.expect("checked above");
        bc.run(bc.client.pool_change(pool, op, listed.clone())).map_err(|e| anyhow::anyhow!("pool {name}: {e}"))?;
        Ok(())
    })
}

/// `lctl pool_list` output: the pools of the file system, or one pool's OSTs.
pub fn print_list(out: &mut impl Write, config: &ClusterConfig, pool: Option<&str>) -> Result<()> {
    let fs = &config.fsname;
    match pool {
        None => {
            writeln!(out, "Pools from {fs}:")?;
            for p in &config.pools {
                writeln!(out, "{fs}.{}", p.name)?;
            }
        }
        Some(name) => {
            let p = config.pool(name).with_context(|| format!("pool {fs}.{name} does not exist"))?;
            writeln!(out, "Pool: {fs}.{name}")?;
            for i in &p.osts {
                writeln!(out, "{fs}-OST{i:04x}_UUID")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::msg::PoolInfo;

    #[test]
    fn ost_names_parse_as_lctl_takes_them() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_osts(&s(&["OST000a", "braid-OST0001_UUID"])).unwrap(), vec![10, 1]);
        assert_eq!(parse_osts(&s(&["OST[0-2]", "5,7"])).unwrap(), vec![0, 1, 2, 5, 7]);
        assert!(parse_osts(&s(&["OSTzz"])).is_err());
        assert!(parse_osts(&s(&["fast"])).is_err());
    }

    #[test]
    fn lists_print_as_lctl_pool_list() {
        let config = ClusterConfig {
            fsname: "braid".into(),
            generation: 1,
            mdts: vec![],
            osts: vec![],
            pools: vec![
                PoolInfo { name: "hot".into(), osts: vec![0, 11] },
                PoolInfo { name: "cool".into(), osts: vec![] },
            ],
            root_squash: None,
        };
        let mut out = Vec::new();
        print_list(&mut out, &config, None).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "Pools from braid:\nbraid.hot\nbraid.cool\n");
        let mut out = Vec::new();
        print_list(&mut out, &config, Some("hot")).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "Pool: braid.hot\nbraid-OST0000_UUID\nbraid-OST000b_UUID\n");
        assert!(print_list(&mut Vec::new(), &config, Some("warm")).is_err());
    }
}

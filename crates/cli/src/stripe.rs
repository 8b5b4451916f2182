//! `braid setstripe` and `braid getstripe`: layouts as Lustre's `lfs` writes and
//! prints them, plain and composite (PFL).
//!
//! `setstripe` takes its options in order, since `-E` ends a component and the options
//! after it describe that component; clap keeps no order between different options,
//! so the arguments are read here, one by one.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use client::{DirHash, DirSpec, Errno, Fid, FileKind, ObjectId, OpenFlags, MDT_BALANCED};
use layout::{Component, ComponentSpec, Layout, LayoutChange, LayoutSpec, Pattern, EOF};

use crate::tools::{creds, with_client};
use crate::ClientOpts;

/// What one `setstripe` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetstripeAction {
    /// The layout of a new file, or a directory's default.
    Set(LayoutSpec),
    /// `-d`: remove a directory's default.
    Delete,
    /// `--component-add`: components after the file's last.
    Add(LayoutSpec),
    /// `--component-del [-I ID]`: trailing uninstantiated components.
    Del { id: Option<u32> },
}

/// A parsed `braid setstripe` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setstripe {
    pub action: SetstripeAction,
    pub path: String,
    pub secret_file: Option<PathBuf>,
    pub timeout_s: Option<u64>,
}

impl Setstripe {
    /// The client options its `--secret-file` and `--timeout-s` give.
    fn client_opts(&self) -> ClientOpts {
        ClientOpts { secret_file: self.secret_file.clone(), timeout_s: self.timeout_s.unwrap_or(60) }
    }
}

/// Usage of `braid setstripe`, for its `--help`.
pub const SETSTRIPE_HELP: &str = "\
Create an empty file with a layout, set a directory's default layout, or change a file's components.

  braid setstripe [STRIPE_OPTIONS] PATH                    a plain layout
  braid setstripe -E END [STRIPE_OPTIONS] [-E END ...] PATH a composite (PFL) layout
  braid setstripe --template NAME PATH                     a built-in layout (seed-table4)
  braid setstripe --component-add -E END [STRIPE_OPTIONS] ... FILE
  braid setstripe --component-del [-I ID] FILE
  braid setstripe -d DIR                                   remove a directory's default

STRIPE_OPTIONS (for the component the last -E began):
  -c, --stripe-count N    OSTs to stripe over (-1: all, 0: the default)
  -S, --stripe-size SIZE  bytes per stripe, a multiple of 64K (e.g. 1M)
  -i, --stripe-index IDX  first OST (-1: the MDS chooses)
  -o, --ost LIST          explicit OSTs, e.g. 0,2-3
  -p, --pool NAME         place on the OSTs of pool NAME (or FSNAME.NAME; see braid pool);
                          later components inherit it
  -L, --layout raid0|mdt  striped over OSTs, or kept on the MDT (Data-on-MDT: the
                          first component only, e.g. -E 64K -L mdt -E -1 -c 4)
  -E, --component-end END where the component ends: a size (64K multiple), or -1 / eof
  -I, --component-id ID   the component --component-del removes (with those after it)
Also: --secret-file FILE, --timeout-s SECONDS.";

fn size_arg(flag: &str, v: &str) -> Result<u64> {
    layout::parse_size(v).with_context(|| format!("{flag} {v}"))
}

fn end_arg(v: &str) -> Result<u64> {
    match v {
        "-1" | "eof" | "EOF" => Ok(EOF),
        _ => size_arg("-E", v),
    }
}

/// Parses the arguments after `setstripe`.
pub fn parse_setstripe(args: &[String]) -> Result<Setstripe> {
    let mut components: Vec<ComponentSpec> = Vec::new();
    let mut cur = ComponentSpec { extent_end: EOF, ..Default::default() };
    let mut ended = false; // whether any -E was given
    let (mut delete, mut add, mut del) = (false, false, false);
    let (mut id, mut template, mut path) = (None, None, None);
    let (mut secret_file, mut timeout_s) = (None, None);
    let mut it = args.iter().map(String::as_str);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = || -> Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().map(str::to_string).with_context(|| format!("{flag} needs a value")),
            }
        };
        match flag {
            "-E" | "--component-end" => {
                let end = end_arg(&value()?)?;
                if ended {
                    components.push(std::mem::take(&mut cur));
                }
                cur.extent_end = end;
                ended = true;
            }
            "-c" | "--stripe-count" => {
                let v = value()?;
                let n: i64 = v.parse().with_context(|| format!("invalid stripe count '{v}'"))?;
                cur.stripe_count = if n == 0 { None } else { Some(n) };
            }
            "-S" | "--stripe-size" => {
                let n = size_arg(flag, &value()?)?;
                cur.stripe_size = if n == 0 { None } else { Some(n) };
            }
            "-i" | "--stripe-index" => {
                let v = value()?;
                cur.stripe_offset = match v.parse::<i64>() {
                    Ok(-1) => None,
                    Ok(i) if (0..=u32::MAX as i64).contains(&i) => Some(i as u32),
                    _ => bail!("invalid stripe index {v} (use -1 for any, or an OST index)"),
                };
            }
            "-o" | "--ost" => cur.ost_list = Some(layout::parse_ost_list(&value()?)?),
            "-p" | "--pool" => {
                let v = value()?;
                let name = proto::msg::pool_part(&v);
                cur.pool = match name {
                    // Lustre's words for "no pool" on this component.
                    "" | "none" | "ignore" => None,
                    _ => {
                        proto::msg::check_pool_name(name).map_err(|e| anyhow::anyhow!("-p {v}: {e}"))?;
                        Some(name.to_string())
                    }
                };
            }
            "-L" | "--layout" => {
                cur.pattern = match value()?.as_str() {
                    "raid0" => Pattern::Raid0,
                    "mdt" => Pattern::Mdt,
                    other => bail!("unknown layout pattern '{other}' (raid0 or mdt)"),
                }
            }
            "-I" | "--component-id" | "--comp-id" => {
                let v = value()?;
                id = Some(v.parse::<u32>().with_context(|| format!("invalid component id '{v}'"))?);
            }
            "-d" | "--delete" => delete = true,
            "--component-add" | "--comp-add" => add = true,
            "--component-del" | "--comp-del" => del = true,
            "--template" => template = Some(value()?),
            "--secret-file" => secret_file = Some(PathBuf::from(value()?)),
            "--timeout-s" => {
                let v = value()?;
                timeout_s = Some(v.parse().with_context(|| format!("invalid --timeout-s '{v}'"))?);
            }
            f if f.starts_with('-') && f.len() > 1 => {
                bail!("unknown setstripe option '{f}' (see braid setstripe --help)")
            }
            p => {
                if path.replace(p.to_string()).is_some() {
                    bail!("setstripe takes one path");
                }
            }
        }
    }
    let path = path.context("setstripe needs a path (see braid setstripe --help)")?;
    let given = ended || cur != ComponentSpec { extent_end: EOF, ..Default::default() };
    components.push(cur);
    let spec = LayoutSpec { components };
    let modes = [delete, add, del, template.is_some()].iter().filter(|&&m| m).count();
    if modes > 1 {
        bail!("-d, --component-add, --component-del and --template go one at a time");
    }
    if id.is_some() && !del {
        bail!("-I names the component --component-del removes");
    }
    let action = if delete || del {
        if given {
            bail!("{} takes no layout options", if delete { "-d" } else { "--component-del" });
        }
        if delete {
            SetstripeAction::Delete
        } else {
            SetstripeAction::Del { id }
        }
    } else if let Some(name) = template {
        if given {
            bail!("--template takes no layout options");
        }
        SetstripeAction::Set(LayoutSpec::template(&name)?)
    } else if add {
        if !ended {
            bail!("--component-add needs the new components' ends (-E)");
        }
        SetstripeAction::Add(spec)
    } else {
        spec.validate()?;
        SetstripeAction::Set(spec)
    };
    Ok(Setstripe { action, path, secret_file, timeout_s })
}

/// Usage of `braid migrate`, for its `--help`.
pub const MIGRATE_HELP: &str = "\
Move a file's bytes to a new layout (another pool, stripe count or size), as Lustre's lfs migrate:
the file keeps its name, FID and attributes; a write racing the copy makes it fail (run it again),
and a file open on another client is refused.

  braid migrate [STRIPE_OPTIONS] FILE       e.g. braid migrate -p cool -c 2 /mnt/braid/big.dat
  braid migrate -m MDT [-v] DIR            move DIR's directories (and their entries) to MDT, as lfs migrate -m
                                           (files keep their inodes where they are, their names move)

STRIPE_OPTIONS as braid setstripe's (-E ends a component; -p POOL, -c N, -S SIZE, -o LIST, ...);
unset ones keep the file's stripe count and size. A file with a Data-on-MDT component moves onto OSTs;
a DoM layout is not a migration's target.
Also: --secret-file FILE, --timeout-s SECONDS.";

/// Runs `braid migrate ARGS` (setstripe's layout options and one file).
pub fn migrate(args: &[String]) -> Result<()> {
    if crate::migrate_mdt::wanted(args) {
        return crate::migrate_mdt::run(args);
    }
    let s = parse_setstripe(args)?;
    let SetstripeAction::Set(spec) = s.action.clone() else {
        bail!("braid migrate takes a layout (setstripe's options), not -d or component changes");
    };
    with_client(&s.client_opts(), &s.path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let a = bc.run(client.resolve(&c, &p.path, false)).map_err(|e| e.at(&p.url()))?;
        if a.kind == FileKind::Dir {
            bail!("{}: braid migrate moves a file's bytes; a directory's files are migrated one by one", p.url());
        }
        let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
        bc.run(client.migrate(&c, parent.fid, &name, spec)).map_err(|e| e.at(&p.url()))?;
        Ok(())
    })
}

/// Runs a parsed `setstripe`.
pub fn setstripe(s: Setstripe) -> Result<()> {
    with_client(&s.client_opts(), &s.path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let found = bc.run(client.resolve(&c, &p.path, true));
        match (&s.action, found) {
            (SetstripeAction::Set(spec), Ok(a)) if a.kind == FileKind::Dir => {
                bc.run(client.set_dir_layout(&c, a.fid, Some(spec.clone()))).map_err(|e| e.at(&p.url()))?;
            }
            (SetstripeAction::Delete, Ok(a)) if a.kind == FileKind::Dir => {
                bc.run(client.set_dir_layout(&c, a.fid, None)).map_err(|e| e.at(&p.url()))?;
            }
            (SetstripeAction::Delete, Ok(_)) => bail!("{}: -d removes a directory's default layout", p.url()),
            (SetstripeAction::Set(_), Ok(_)) => {
                bail!("{}: file exists; a file's layout is set when it is created", p.url())
            }
            (SetstripeAction::Add(spec), Ok(a)) if a.kind == FileKind::File => {
                let change = LayoutChange::AddComponents(spec.clone());
                bc.run(client.change_layout(&c, a.fid, change)).map_err(|e| e.at(&p.url()))?;
            }
            (&SetstripeAction::Del { id }, Ok(a)) if a.kind == FileKind::File => {
                let change = LayoutChange::DelComponents { id };
                bc.run(client.change_layout(&c, a.fid, change)).map_err(|e| e.at(&p.url()))?;
            }
            (SetstripeAction::Add(_) | SetstripeAction::Del { .. }, Ok(_)) => {
                bail!("{}: components are changed on a regular file", p.url())
            }
            (SetstripeAction::Set(spec), Err(e)) if e.errno() == Errno::NoEnt => {
                let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
                let flags = OpenFlags { read: false, write: true, truncate: false };
                let (f, _, _) = bc
                    .run(client.create(&c, parent.fid, &name, 0o644, true, flags, Some(spec.clone())))
                    .map_err(|e| e.at(&p.url()))?;
                bc.run(client.close(f))?;
            }
            (_, Err(e)) => return Err(e.at(&p.url()).into()),
        }
        Ok(())
    })
}

/// What `getstripe` prints of each layout.
#[derive(Debug, Clone, Default)]
pub struct GetstripeOpts {
    /// `-d`: only a directory's default.
    pub directory_only: bool,
    /// `-c`, `-S`, `-i`: only these fields.
    pub count: bool,
    pub size: bool,
    pub index: bool,
    /// `-I ID`: only this component.
    pub component: Option<u32>,
    /// `--component-count`: only the number of components.
    pub component_count: bool,
}

impl GetstripeOpts {
    fn fields_only(&self) -> bool {
        self.count || self.size || self.index
    }
}

/// `lmm_stripe_offset` of a component: its first OST, `-1` before it has any.
fn stripe_offset(comp: &Component) -> String {
    comp.osts.first().map_or("-1".to_string(), u32::to_string)
}

/// A component's stripe count as Lustre prints it: the OSTs it has, or the count it
/// asks for while it has none.
fn stripe_count(comp: &Component) -> i64 {
    if comp.is_instantiated() {
        comp.stripe_count() as i64
    } else {
        comp.stripe_count_wanted
    }
}

/// The index line of a component: the MDT holding a DoM component, else the first OST.
fn index_line(comp: &Component, fid: Fid) -> String {
    if comp.is_dom() {
        format!("lmm_mdt_index:     {}", fid.mdt())
    } else {
        format!("lmm_stripe_offset: {}", stripe_offset(comp))
    }
}

fn print_fields(out: &mut impl Write, comp: &Component, o: &GetstripeOpts, indent: &str, labelled: bool) -> Result<()> {
    let fields = [
        (o.count, "lmm_stripe_count:  ", stripe_count(comp).to_string()),
        (o.size, "lmm_stripe_size:   ", comp.stripe_size.to_string()),
        (o.index, "lmm_stripe_offset: ", stripe_offset(comp)),
    ];
    for (wanted, label, value) in fields {
        if wanted {
            match labelled {
                true => writeln!(out, "{indent}{label}{value}")?,
                false => writeln!(out, "{value}")?,
            }
        }
    }
    Ok(())
}

/// `fid`: the FID the file's objects are named by.
fn print_raid0(out: &mut impl Write, fid: Fid, layout_gen: u32, comp: &Component) -> Result<()> {
    writeln!(out, "lmm_stripe_count:  {}", comp.stripe_count())?;
    writeln!(out, "lmm_stripe_size:   {}", comp.stripe_size)?;
    writeln!(out, "lmm_pattern:       {}", comp.pattern.name())?;
    writeln!(out, "lmm_layout_gen:    {layout_gen}")?;
    writeln!(out, "lmm_stripe_offset: {}", stripe_offset(comp))?;
    if let Some(pool) = &comp.pool {
        writeln!(out, "lmm_pool:          {pool}")?;
    }
    if comp.is_instantiated() {
        writeln!(out, "\tobdidx\t\t objid\t\t objid\t\t group")?;
        for (stripe, ost) in comp.osts.iter().enumerate() {
            let o = ObjectId { fid, component: comp.id, stripe: stripe as u32 };
            writeln!(out, "\t{ost:>6}\t{:>14}\t{:>#14x}\t{:>#14x}", o.objid(), o.objid(), fid.seq)?;
        }
    }
    Ok(())
}

/// One component of a composite layout, as `lfs getstripe` prints it.
/// `objects`: the FID the file's objects are named by (see `layout::Layout::objects`).
fn print_component(out: &mut impl Write, (fid, objects): (Fid, Fid), comp: &Component) -> Result<()> {
    writeln!(out, "    lcme_id:             {}", comp.id)?;
    writeln!(out, "    lcme_mirror_id:      {}", comp.mirror)?;
    writeln!(out, "    lcme_flags:          {}", comp.flag_names())?;
    writeln!(out, "    lcme_extent.e_start: {}", comp.extent_start)?;
    let end = if comp.extent_end == EOF { "EOF".to_string() } else { comp.extent_end.to_string() };
    writeln!(out, "    lcme_extent.e_end:   {end}")?;
    writeln!(out, "      lmm_stripe_count:  {}", stripe_count(comp))?;
    writeln!(out, "      lmm_stripe_size:   {}", comp.stripe_size)?;
    writeln!(out, "      lmm_pattern:       {}", comp.pattern.name())?;
    // Lustre prints a component's own generation, 65535 before it is instantiated.
    writeln!(out, "      lmm_layout_gen:    {}", if comp.is_instantiated() { 0 } else { 65535 })?;
    writeln!(out, "      {}", index_line(comp, fid))?;
    if let Some(pool) = &comp.pool {
        writeln!(out, "      lmm_pool:          {pool}")?;
    }
    if comp.is_instantiated() && !comp.is_dom() {
        writeln!(out, "      lmm_objects:")?;
        for (stripe, ost) in comp.osts.iter().enumerate() {
            let o = ObjectId { fid: objects, component: comp.id, stripe: stripe as u32 };
            writeln!(
                out,
                "      - {stripe}: {{ l_ost_idx: {ost}, l_fid: [{:#x}:{:#x}:0x0] }}",
                objects.seq,
                o.objid()
            )?;
        }
    }
    Ok(())
}

/// A file's layout, as `lfs getstripe FILE` with the options of `o`.
pub fn print_layout(out: &mut impl Write, name: &str, fid: Fid, l: &Layout, o: &GetstripeOpts) -> Result<()> {
    if o.component_count {
        writeln!(out, "{}", l.components.len())?;
        return Ok(());
    }
    let chosen: Vec<&Component> = match o.component {
        Some(id) => {
            let c = l.components.iter().find(|c| c.id == id);
            vec![c.with_context(|| format!("{name}: no component with id {id}"))?]
        }
        None => l.components.iter().collect(),
    };
    if o.fields_only() {
        let single = chosen.len() == 1;
        for c in chosen {
            if !single {
                writeln!(out, "lcme_id:             {}", c.id)?;
            }
            print_fields(out, c, o, if single { "" } else { "  " }, !single)?;
        }
        return Ok(());
    }
    writeln!(out, "{name}")?;
    // A layout with a DoM component is composite, as Lustre's (it takes -E).
    if !l.is_composite() && l.dom_end().is_none() {
        return print_raid0(out, proto::objects_fid(fid, l), l.generation, &l.components[0]);
    }
    if o.component.is_none() {
        writeln!(out, "  lcm_layout_gen:    {}", l.generation)?;
        writeln!(out, "  lcm_mirror_count:  {}", l.mirror_count())?;
        writeln!(out, "  lcm_entry_count:   {}", l.components.len())?;
    }
    for c in chosen {
        print_component(out, (fid, proto::objects_fid(fid, l)), c)?;
        writeln!(out)?;
    }
    Ok(())
}

fn default_line(c: &ComponentSpec) -> String {
    let count = c.stripe_count.map_or("0".to_string(), |n| n.to_string());
    let size = c.stripe_size.map_or("0".to_string(), |n| n.to_string());
    let offset = c.stripe_offset.map_or("-1".to_string(), |n| n.to_string());
    let (size, pattern) = match c.pattern {
        Pattern::Mdt => (c.extent_end.to_string(), "mdt"),
        Pattern::Raid0 => (size, "raid0"),
    };
    let mut line =
        format!("stripe_count:  {count} stripe_size:   {size} pattern:       {pattern} stripe_offset: {offset}");
    if let Some(list) = &c.ost_list {
        line += &format!(" ost_list: {}", list.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    if let Some(pool) = &c.pool {
        line += &format!(" pool:          {pool}");
    }
    line
}

/// A directory's default layout, as `lfs getstripe -d DIR`: one line for a plain
/// default, the composite header and one line per component for a composite one.
pub fn print_default(out: &mut impl Write, name: &str, spec: &Option<LayoutSpec>) -> Result<()> {
    writeln!(out, "{name}")?;
    match spec {
        None => writeln!(
            out,
            "stripe_count:  (inherited) stripe_size:   (inherited) pattern:       raid0 stripe_offset: -1"
        )?,
        Some(s) if s.components.len() == 1 && s.components[0].pattern == Pattern::Raid0 => {
            writeln!(out, "{}", default_line(&s.components[0]))?
        }
        Some(s) => {
            writeln!(out, "  lcm_layout_gen:    0")?;
            writeln!(out, "  lcm_mirror_count:  1")?;
            writeln!(out, "  lcm_entry_count:   {}", s.components.len())?;
            let mut start = 0;
            for c in &s.components {
                writeln!(out, "    lcme_id:             N/A")?;
                writeln!(out, "    lcme_mirror_id:      N/A")?;
                writeln!(out, "    lcme_flags:          0")?;
                writeln!(out, "    lcme_extent.e_start: {start}")?;
                let end = if c.extent_end == EOF { "EOF".to_string() } else { c.extent_end.to_string() };
                writeln!(out, "    lcme_extent.e_end:   {end}")?;
                writeln!(out, "      {}", default_line(c))?;
                writeln!(out)?;
                start = c.extent_end;
            }
        }
    }
    Ok(())
}

pub fn getstripe(opts: &ClientOpts, path: &str, o: &GetstripeOpts) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let a = bc.run(client.resolve(&c, &p.path, true)).map_err(|e| e.at(&p.url()))?;
        let mut out = std::io::stdout().lock();
        if a.kind != FileKind::Dir {
            let l = a.layout.as_ref().context("not a regular file")?;
            return print_layout(&mut out, path, a.fid, l, o);
        }
        let spec = bc.run(client.get_dir_layout(a.fid))?;
        print_default(&mut out, path, &spec)?;
        if o.directory_only {
            return Ok(());
        }
        let mut entries = bc.run(client.readdir_all(&c, a.fid))?;
        entries.sort_by(|x, y| x.name.cmp(&y.name));
        for e in entries.into_iter().filter(|e| e.kind == FileKind::File) {
            let fa = bc.run(client.getattr(e.fid))?;
            if let Some(l) = &fa.layout {
                writeln!(out)?;
                print_layout(&mut out, &format!("{}/{}", path.trim_end_matches('/'), e.name), fa.fid, l, o)?;
            }
        }
        Ok(())
    })
}

/// Where a directory goes over MDTs as `-i K -c N -H HASH` ask: `None` when none of
/// them is given. `-i -1` (or no `-i` with `-c`) lets the MDS choose the first MDT;
/// `-c -1` stripes over every MDT.
pub fn dir_spec(mdt: Option<i64>, count: Option<i64>, hash: Option<&str>) -> Result<Option<DirSpec>> {
    if mdt.is_none() && count.is_none() && hash.is_none() {
        return Ok(None);
    }
    let index = |v: i64, what: &str| match v {
        -1 => Ok(u32::MAX),
        k if (0..u32::MAX as i64).contains(&k) => Ok(k as u32),
        k => bail!("invalid {what} {k}: want a number >= 0, or -1"),
    };
    let spec = DirSpec {
        mdt: mdt.map_or(Ok(MDT_BALANCED), |k| index(k, "MDT index"))?,
        count: match count {
            Some(0) => bail!("invalid MDT count 0: want N >= 1, or -1 for every MDT"),
            Some(n) => index(n, "MDT count")?,
            None => 1,
        },
        hash: hash.map(DirHash::parse).transpose().map_err(anyhow::Error::msg)?.unwrap_or_default(),
    };
    spec.check().map_err(anyhow::Error::msg)?;
    Ok(Some(spec))
}

/// `setdirstripe [-i K] [-c N] [-H HASH] DIR`: makes DIR as `braid mkdir` does; with
/// `-D` (`default`), sets DIR's default for new directories instead (`-i -1` when
/// nothing is given), or removes it with `-d` (`delete`).
pub fn setdirstripe(opts: &ClientOpts, path: &str, default: bool, delete: bool, spec: Option<DirSpec>) -> Result<()> {
    match (default, delete) {
        (false, true) => bail!("-d removes a default for new subdirectories: use it with -D"),
        (false, false) => crate::tools::mkdir(opts, &[path.to_string()], false, spec),
        (true, true) => set_dirs_default(opts, path, None),
        (true, false) => set_dirs_default(opts, path, Some(spec.unwrap_or(DirSpec::on(MDT_BALANCED)))),
    }
}

/// DIR's default for new directories (`setdirstripe -D`), or none.
fn set_dirs_default(opts: &ClientOpts, path: &str, spec: Option<DirSpec>) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let c = creds();
        let a = bc.run(bc.client.resolve(&c, &p.path, true)).map_err(|e| e.at(&p.url()))?;
        let r = match spec {
            None => bc.run(bc.client.removexattr(&c, a.fid, DirSpec::XATTR)),
            Some(d) => bc.run(bc.client.setxattr(&c, a.fid, DirSpec::XATTR, &d.to_xattr(), client::XattrMode::Any)),
        };
        r.map_err(|e| e.at(&p.url()))?;
        Ok(())
    })
}

/// `getstripe -m`: the index of the MDT holding PATH's inode.
pub fn get_mdt_index(opts: &ClientOpts, path: &str) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let a = bc.run(bc.client.resolve(&creds(), &p.path, true)).map_err(|e| e.at(&p.url()))?;
        println!("{}", a.fid.mdt());
        Ok(())
    })
}

/// `getdirstripe`'s field selection (`-c`, `-i`/`-m`, `-H`); none selected prints all.
/// With `default` (`-D`), the directory's default for new subdirectories is shown.
pub struct DirstripeOpts {
    pub default: bool,
    pub count: bool,
    pub index: bool,
    pub hash: bool,
}

/// `getdirstripe DIR`, in `lfs getdirstripe`'s format: a striped directory's
/// stripe count, first MDT and hash type, then its shards (`mdtidx FID`); a directory
/// that is not striped shows stripe count 0, the MDT holding it, and hash type
/// `none`.
pub fn getdirstripe(opts: &ClientOpts, path: &str, o: &DirstripeOpts) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let a = bc.run(bc.client.resolve(&creds(), &p.path, true)).map_err(|e| e.at(&p.url()))?;
        if a.kind != FileKind::Dir {
            anyhow::bail!("{}: not a directory", p.url());
        }
        let signed = |v: u32| if v == u32::MAX { -1 } else { v as i64 };
        let mut shards = Vec::new();
        let (count, offset, hash) = if o.default {
            match bc.run(bc.client.getxattr(&creds(), a.fid, DirSpec::XATTR)) {
                Ok(v) => {
                    let d = DirSpec::from_xattr(&v).map_err(anyhow::Error::msg)?;
                    let hash = if d.count == 1 { "none" } else { d.hash.name() };
                    (signed(d.count), signed(d.mdt), hash)
                }
                Err(e) if e.errno() == client::Errno::NoData => (0, -1, "none"),
                Err(e) => return Err(e.at(&p.url()).into()),
            }
        } else if let Some(s) = &a.stripes {
            shards.clone_from(&s.shards);
            (s.shards.len() as i64, s.master().mdt() as i64, s.hash.name())
        } else {
            (0, a.fid.mdt() as i64, "none")
        };
        match (o.count, o.index, o.hash) {
            (true, _, _) => println!("{count}"),
            (_, true, _) => println!("{offset}"),
            (_, _, true) => println!("{hash}"),
            _ => {
                println!("lmv_stripe_count: {count} lmv_stripe_offset: {offset} lmv_hash_type: {hash}");
                if !shards.is_empty() {
                    println!("mdtidx\t\t FID[seq:oid:ver]");
                    for fid in shards {
                        println!("{:6}\t\t {fid}", fid.mdt());
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Setstripe> {
        parse_setstripe(&line.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn plain_options_make_one_component() {
        let s = parse("-c 4 -S 1M -i -1 f").unwrap();
        let SetstripeAction::Set(spec) = s.action.clone() else { panic!("{s:?}") };
        assert_eq!(spec.components.len(), 1);
        assert_eq!(spec.components[0].stripe_count, Some(4));
        assert_eq!(spec.components[0].stripe_size, Some(1 << 20));
        assert_eq!(spec.components[0].extent_end, EOF);
        assert!(parse("-c 2 -S 100K f").is_err());
        assert!(parse("-c 3 -o 0,1 f").is_err());
        assert!(parse("-i -5 f").is_err());
        assert!(parse("-c 2").is_err(), "no path");
    }

    #[test]
    fn each_dash_e_ends_a_component() {
        let s = parse("-E 4M -c 1 -S 1M -E 512M -c 2 -E -1 -c 4 --timeout-s 20 dir").unwrap();
        assert_eq!((s.path.as_str(), s.timeout_s), ("dir", Some(20)));
        let SetstripeAction::Set(spec) = s.action.clone() else { panic!() };
        let ends: Vec<u64> = spec.components.iter().map(|c| c.extent_end).collect();
        assert_eq!(ends, vec![4 << 20, 512 << 20, EOF]);
        let counts: Vec<Option<i64>> = spec.components.iter().map(|c| c.stripe_count).collect();
        assert_eq!(counts, vec![Some(1), Some(2), Some(4)]);
        assert!(parse("--component-end=eof -c 2 f").is_ok());
    }

    #[test]
    fn impossible_layouts_name_the_component() {
        let e = parse("-E 4M -c 1 -E 2M -c 2 -E -1 f").unwrap_err();
        assert!(e.to_string().contains("component 2"), "{e:#}");
        let e = parse("-E 4M -E 4100K -E -1 f").unwrap_err();
        assert!(e.to_string().contains("component 2") && e.to_string().contains("64 KiB"), "{e:#}");
        let many: String = (1..=65).map(|i| format!("-E {i}M ")).collect();
        assert!(parse(&format!("{many} f")).unwrap_err().to_string().contains("too many components"));
        let SetstripeAction::Set(dom) = parse("-E 64K -L mdt -E -1 -c 4 -S 1M d").unwrap().action else { panic!() };
        assert_eq!(dom.components[0], ComponentSpec::dom(64 << 10));
        assert_eq!(dom.components[1].stripe_count, Some(4));
        let e = parse("-E 1M -c 1 -E 2M -L mdt -E -1 f").unwrap_err().to_string();
        assert!(e.contains("component 2") && e.contains("first"), "{e}");
        assert!(parse("-E 64K -L mdt -c 2 -E -1 f").is_err(), "a DoM component has no stripes");
        assert!(parse("-E 64K -L bogus f").is_err());
    }

    #[test]
    fn component_add_del_delete_and_templates() {
        assert!(matches!(parse("--component-add -E -1 -c 4 f").unwrap().action, SetstripeAction::Add(_)));
        assert!(parse("--component-add -c 4 f").is_err(), "add needs -E");
        assert_eq!(parse("--component-del -I 3 f").unwrap().action, SetstripeAction::Del { id: Some(3) });
        assert_eq!(parse("--component-del f").unwrap().action, SetstripeAction::Del { id: None });
        assert!(parse("--component-del -c 2 f").is_err());
        assert!(parse("-I 3 f").is_err());
        assert_eq!(parse("-d dir").unwrap().action, SetstripeAction::Delete);
        let SetstripeAction::Set(t) = parse("--template seed-table4 dir").unwrap().action else { panic!() };
        assert_eq!(t.components.len(), 6);
        assert!(parse("--template nope dir").is_err());
        assert!(parse("--template seed-table4 -c 2 dir").is_err());
        assert!(parse("--bogus f").is_err());
    }
}

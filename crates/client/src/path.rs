//! Path resolution over MDS lookups, following symlinks (at most 40, like Linux).

use proto::msg::{Attr, Creds, FileKind};
use proto::{Errno, Fid};

use crate::{Client, ClientError, Result};

const MAX_SYMLINKS: usize = 40;

impl Client {
    /// Resolves an absolute path inside the file system (`/` is the root). With
    /// `follow_last`, a final symlink is followed too.
    pub async fn resolve(&self, creds: &Creds, path: &str, follow_last: bool) -> Result<Attr> {
        self.observe("resolve", None, 0, 0, async {
            let mut stack: Vec<Attr> = vec![self.getattr(Fid::ROOT).await.map_err(|e| e.at("/"))?];
            let mut todo: Vec<String> = components(path).into_iter().rev().collect();
            let mut links = 0;
            while let Some(name) = todo.pop() {
                if name == ".." {
                    if stack.len() > 1 {
                        stack.pop();
                    }
                    continue;
                }
                let here = stack.last().expect("root stays").clone();
                if here.kind != FileKind::Dir {
                    return Err(ClientError::Errno(Errno::NotDir, format!("{path}: not a directory")));
                }
                let attr = self.lookup(creds, here.fid, &name).await.map_err(|e| e.at(path))?;
                let last = todo.is_empty();
                if attr.kind == FileKind::Symlink && (!last || follow_last) {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        let msg = format!("{path}: too many levels of symbolic links");
                        return Err(ClientError::Errno(Errno::Loop, msg));
                    }
                    let target = self.readlink(attr.fid).await?;
                    if target.starts_with('/') {
                        stack.truncate(1);
                    }
                    todo.extend(components(&target).into_iter().rev());
                    continue;
                }
                stack.push(attr);
            }
            Ok(stack.pop().expect("at least the root"))
        })
        .await
    }

    /// Resolves the parent directory of `path` and returns it with the last name.
    pub async fn resolve_parent(&self, creds: &Creds, path: &str) -> Result<(Attr, String)> {
        self.observe("resolve_parent", None, 0, 0, async {
            let mut parts = components(path);
            let Some(name) = parts.pop() else {
                return Err(ClientError::Errno(Errno::Inval, format!("{path}: the root has no parent")));
            };
            if name == ".." {
                return Err(ClientError::Errno(Errno::Inval, format!("{path}: ends in '..'")));
            }
            let parent = self.resolve(creds, &format!("/{}", parts.join("/")), true).await?;
            if parent.kind != FileKind::Dir {
                return Err(ClientError::Errno(Errno::NotDir, format!("{path}: parent is not a directory")));
            }
            Ok((parent, name))
        })
        .await
    }
}

/// Path components without empty ones and `.`.
pub fn components(path: &str) -> Vec<String> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string).collect()
}

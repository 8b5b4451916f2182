//! What the MDS knows of the cluster: the OSTs new files are placed on and the
//! configuration the destroy queue finds them in, refreshed from the MGS by the
//! `cluster-refresh` worker.

use layout::OstState;
use proto::msg::ClusterConfig;

#[derive(Default)]
pub struct ClusterView {
    pub osts: Vec<OstState>,
    pub config: Option<ClusterConfig>,
}

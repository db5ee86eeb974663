//! The cases `suite!` runs on both environments (see main.rs), one module per topic.

mod addresses;
mod lifecycle;
mod networks;
mod share_ip;
mod sharing;

pub use addresses::*;
pub use lifecycle::*;
pub use networks::*;
pub use share_ip::*;
pub use sharing::*;

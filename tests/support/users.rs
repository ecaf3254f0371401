//! A broker user of one test's own ([`BrokerUser`]), on the tests' broker
//! (`super::rabbitmqctl_command`), deleted when dropped.

/// A broker user with a password nothing else contains and the given permissions on `/`,
/// deleted when dropped (on panic too).
pub struct BrokerUser {
    pub name: String,
    pub password: String,
}

impl BrokerUser {
    /// A user named after `prefix` with `[configure, write, read]` permissions on `/` (`".*"`
    /// for all, `"^$"` for none).
    pub fn new(prefix: &str, permissions: [&str; 3]) -> BrokerUser {
        let name = super::unique(prefix);
        let password = format!("pw-{}", acemq_amqp::new_id().replace('-', ""));
        super::rabbitmqctl(&["add_user", &name, &password]);
        let [configure, write, read] = permissions;
        super::rabbitmqctl(&["set_permissions", "-p", "/", &name, configure, write, read]);
        BrokerUser { name, password }
    }

    /// The tests' broker, logged in as this user.
    pub fn url(&self) -> String {
        format!(
            "amqp://{}:{}@{}/",
            self.name,
            self.password,
            super::broker_addr()
        )
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = super::rabbitmqctl_command()
            .args(["delete_user", &self.name])
            .output();
    }
}

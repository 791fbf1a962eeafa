//! Every session of the server: creating them within the limits (all,
//! per client), finding them by id or watch id, expiring and ending them.

use super::*;

/// How long a session must have had no connection before a full server
/// ends it to make room for a new one (a page reconnects within seconds;
/// a TTL shorter than this is used instead).
pub const RECLAIM_AFTER: Duration = Duration::from_secs(10);

/// Every session of the server.
pub struct Sessions {
    pub(super) map: Mutex<HashMap<String, Arc<Session>>>,
    backend: Backend,
    config: SessionConfig,
    pub metrics: Arc<Metrics>,
    /// Draining: no new sessions; the others run until they end.
    draining: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

impl Sessions {
    pub fn new(backend: Backend, config: SessionConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            backend,
            config,
            metrics,
            draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on no new session starts here (`/readyz` says 503).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// A new session, unless the server holds as many as it may. Starting
    /// one (a CUDA context, a thread) blocks: call it off the async runtime.
    /// The global map is locked only to check the limit and to insert.
    pub fn create(&self) -> Result<Arc<Session>, ConnectionError> {
        self.create_for(None)
    }

    /// [`Sessions::create`] for a client at `client`, which may hold at most
    /// `max_per_client` sessions (loopback too: behind a trusted proxy the
    /// client is the address it forwards).
    pub fn create_for(&self, client: Option<IpAddr>) -> Result<Arc<Session>, ConnectionError> {
        self.create_as(client, None)
    }

    /// [`Sessions::create_for`] for a user an authenticating proxy named:
    /// the session is theirs, and they may hold at most `max_per_client`.
    pub fn create_as(
        &self,
        client: Option<IpAddr>,
        user: Option<String>,
    ) -> Result<Arc<Session>, ConnectionError> {
        if self.is_draining() {
            return Err(ConnectionError::new(
                ConnectionErrorKind::SessionLimit,
                "this server is draining and starts no new sessions: connect again to reach another",
            ));
        }
        {
            let mut map = self.map.lock().expect("sessions lock");
            let reclaimed = self.make_room(&mut map);
            let checked = self.check_owner(&map, client, user.as_deref());
            drop(map);
            if let Some(s) = reclaimed {
                s.shut_down();
            }
            checked?;
        }
        let config = self.config.clone();
        let owner = (client, user);
        let session =
            Session::new(&self.backend, config, self.metrics.clone(), owner).map_err(|e| {
                ConnectionError::new(
                    ConnectionErrorKind::ServerError,
                    format!("the server could not start a session: {e}"),
                )
            })?;
        // Checked again where the session is inserted: two connections of
        // one user started at once must not both pass.
        let mut map = self.map.lock().expect("sessions lock");
        let owner = session.owner.as_deref();
        let reclaimed = self.make_room(&mut map);
        if let Some(s) = &reclaimed {
            s.shut_down();
        }
        if let Err(e) = self.check_owner(&map, session.client, owner) {
            drop(map);
            session.shut_down();
            return Err(e);
        }
        map.insert(session.id.clone(), session.clone());
        Metrics::inc(&self.metrics.sessions_created);
        Ok(session)
    }

    /// A full server makes room for one more: the session that has gone
    /// longest without any connection (one that never ran a command
    /// first) ends, once it has had none for [`RECLAIM_AFTER`]; so no one
    /// can hold every slot with sessions they left (their TTL), only with
    /// connections they keep open, which are limited per client.
    fn make_room(&self, map: &mut HashMap<String, Arc<Session>>) -> Option<Arc<Session>> {
        if map.len() < self.config.max_sessions {
            return None;
        }
        let now = Instant::now();
        let (id, _) = (map.iter())
            .filter_map(|(id, s)| {
                let (used, alone) = s.unattended(now)?;
                let after = RECLAIM_AFTER.min(self.config.ttl);
                (alone >= after).then(|| (id.clone(), (!used, alone)))
            })
            .max_by_key(|(_, order)| *order)?;
        let s = map.remove(&id)?;
        tracing::info!(session = %&s.id[..8], "session ended to make room: the server is full and it had no connection");
        Metrics::inc(&self.metrics.sessions_expired);
        Some(s)
    }

    /// The server's limit, then the user's (or the client's): whether one
    /// more session may start, given the sessions in `map`.
    fn check_owner(
        &self,
        map: &HashMap<String, Arc<Session>>,
        client: Option<IpAddr>,
        user: Option<&str>,
    ) -> Result<(), ConnectionError> {
        if map.len() >= self.config.max_sessions {
            return Err(self.limit_error());
        }
        match user {
            Some(user) => self.check_user(map, user),
            None => self.check_client(map, client),
        }
    }

    fn check_user(
        &self,
        map: &HashMap<String, Arc<Session>>,
        user: &str,
    ) -> Result<(), ConnectionError> {
        let max = self.config.max_per_client;
        let held = map
            .values()
            .filter(|s| s.owner.as_deref() == Some(user))
            .count();
        if max > 0 && held >= max {
            Metrics::inc(&self.metrics.refused.session_limit);
            return Err(ConnectionError::new(
                ConnectionErrorKind::SessionLimit,
                format!("you already hold {held} sessions, the most one user may; reconnect to one of them (?session=) or wait for one to expire"),
            ));
        }
        Ok(())
    }

    fn check_client(
        &self,
        map: &HashMap<String, Arc<Session>>,
        client: Option<IpAddr>,
    ) -> Result<(), ConnectionError> {
        let (Some(ip), max) = (client, self.config.max_per_client) else {
            return Ok(());
        };
        let key = crate::network::client_key(ip);
        let held = (map.values())
            .filter(|s| s.client.map(crate::network::client_key) == Some(key))
            .count();
        if max > 0 && held >= max {
            Metrics::inc(&self.metrics.refused.session_limit);
            return Err(ConnectionError::new(
                ConnectionErrorKind::SessionLimit,
                format!("your address already holds {held} sessions, the most one client may; reconnect to one of them (?session=) or wait for one to expire"),
            ));
        }
        Ok(())
    }

    fn limit_error(&self) -> ConnectionError {
        Metrics::inc(&self.metrics.refused.session_limit);
        ConnectionError::new(
            ConnectionErrorKind::SessionLimit,
            format!(
                "the server already holds {} sessions, its limit; try again later",
                self.config.max_sessions
            ),
        )
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.map.lock().expect("sessions lock").get(id).cloned()
    }

    pub fn by_watch_id(&self, watch_id: &str) -> Option<Arc<Session>> {
        self.map
            .lock()
            .expect("sessions lock")
            .values()
            .find(|s| s.watch_id == watch_id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.map.lock().expect("sessions lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops sessions whose owner has been gone longer than the TTL.
    pub fn reap(&self) -> usize {
        let now = Instant::now();
        let expired: Vec<Arc<Session>> = {
            let mut map = self.map.lock().expect("sessions lock");
            let ids: Vec<String> = map
                .values()
                .filter(|s| s.expired(now))
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        for s in &expired {
            tracing::info!(session = %&s.id[..8], "session expired");
            s.shut_down();
            Metrics::inc(&self.metrics.sessions_expired);
        }
        expired.len()
    }

    /// Drops every session (server shutdown).
    /// The server is stopping: running commands are asked to stop and get
    /// up to `grace` to answer; then every session ends.
    pub fn drain_and_shut_down(&self, grace: Duration) {
        let all: Vec<Arc<Session>> = self
            .map
            .lock()
            .expect("sessions lock")
            .values()
            .cloned()
            .collect();
        for s in &all {
            s.stop_for_shutdown();
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && all.iter().any(|s| s.busy()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.shut_down_all();
    }

    pub fn shut_down_all(&self) {
        let all: Vec<Arc<Session>> = self
            .map
            .lock()
            .expect("sessions lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in all {
            s.shut_down();
        }
    }

    pub fn gauges(&self) -> Gauges {
        let map = self.map.lock().expect("sessions lock");
        let mut g = Gauges {
            sessions: map.len() as u64,
            ..Gauges::default()
        };
        for s in map.values() {
            let stats = &s.live().snapshot.stats;
            g.device_used_bytes += stats.device_used_bytes;
            g.allocated_bytes += stats.allocated_bytes;
            g.reserved_bytes += stats.reserved_bytes;
        }
        g
    }
}

/* The read deadline. libmicrohttpd's connection timeout counts idle time only, so a client that
 * sends its headers a byte a second keeps a connection (and, one thread per connection, a
 * thread) forever. Each connection here gets a deadline when it opens and again after each
 * response; the request must have fully arrived by then. A thread wakes a few times a second
 * and shuts down the sockets of connections past their deadline, which makes their threads see
 * the end of the stream and close them.
 *
 * A record leaves the list in the CLOSED notification, which libmicrohttpd sends before it
 * closes the descriptor: under guard_mu the descriptor of a listed record is still this
 * connection's, never a reused one. */
#include "server/server_internal.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define GUARD_PERIOD_MS 100

static double deadline_from_now(const server *s) {
    return base_now() + (double)s->o.read_timeout_s;
}

void server_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    if (s->o.read_timeout_s <= 0) return;
    server_conn *r = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) return;
        r = base_xcalloc(1, sizeof *r);
        r->fd = ci->connect_fd;
        pthread_mutex_lock(&s->guard_mu);
        r->deadline = deadline_from_now(s);
        r->next = s->conns;
        if (s->conns) s->conns->prev = r;
        s->conns = r;
        pthread_mutex_unlock(&s->guard_mu);
        *socket_context = r;
        return;
    }
    if (!r) return;
    pthread_mutex_lock(&s->guard_mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        s->conns = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_unlock(&s->guard_mu);
    free(r);
    *socket_context = NULL;
}

void server_guard_arm(server *s, struct MHD_Connection *c, bool armed) {
    if (s->o.read_timeout_s <= 0) return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    server_conn *r = ci ? ci->socket_context : NULL;
    if (!r) return;
    pthread_mutex_lock(&s->guard_mu);
    r->deadline = armed ? deadline_from_now(s) : 0;
    pthread_mutex_unlock(&s->guard_mu);
}

static void *guard_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        double now = base_now();
        for (server_conn *r = s->conns; r; r = r->next) {
            if (r->deadline <= 0 || now < r->deadline) continue;
            shutdown(r->fd, SHUT_RDWR);
            r->deadline = 0;
            __atomic_add_fetch(&s->n_dropped, 1, __ATOMIC_RELAXED);
        }
        base_cond_wait_ms(&s->guard_cv, &s->guard_mu, GUARD_PERIOD_MS);
    }
    pthread_mutex_unlock(&s->guard_mu);
    return NULL;
}

int server_guard_start(server *s, base_err *err) {
    if (s->o.read_timeout_s <= 0) return 0;
    if (pthread_create(&s->guard, NULL, guard_main, s) != 0)
        return base_fail(err, "--read-timeout: cannot start the thread that enforces it");
    s->guard_running = true;
    return 0;
}

void server_guard_stop(server *s) {
    if (s->guard_running) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cv);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard, NULL);
        s->guard_running = false;
    }
}

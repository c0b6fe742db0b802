import jakarta.servlet.Servlet;
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

/**
 * Apache Iceberg's REST catalog test server (org.apache.iceberg.rest.RESTCatalogServer), listening on
 * 127.0.0.1 only. The server itself builds Jetty with {@code new Server(port)}, which binds every
 * interface and takes no host; this launcher builds the same servlet on the same backend catalog
 * (configured, as the server's is, by CATALOG_* environment variables) behind a connector bound to
 * the loopback address. Run as a single-file source program:
 * {@code java -cp <the server's jars> LocalRestCatalog.java PORT}.
 */
public class LocalRestCatalog {
  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    Class<?> serverClass = Class.forName("org.apache.iceberg.rest.RESTCatalogServer");
    Object catalogServer = accessible(serverClass.getDeclaredConstructor()).newInstance();
    Method initialize = serverClass.getDeclaredMethod("initializeBackendCatalog");
    initialize.setAccessible(true);
    Object context = initialize.invoke(catalogServer);

    Class<?> adapterClass = Class.forName("org.apache.iceberg.rest.RESTCatalogAdapter");
    Object adapter = accessible(Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter")
        .getDeclaredConstructor(context.getClass())).newInstance(context);
    Servlet servlet = (Servlet) accessible(Class.forName("org.apache.iceberg.rest.RESTCatalogServlet")
        .getDeclaredConstructor(adapterClass)).newInstance(adapter);

    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(servlet), "/*");
    handler.insertHandler(new GzipHandler());
    Server http = new Server();
    ServerConnector connector = new ServerConnector(http);
    connector.setHost("127.0.0.1");
    connector.setPort(port);
    http.addConnector(connector);
    http.setHandler(handler);
    http.start();
    http.join();
  }

  private static <T> Constructor<T> accessible(Constructor<T> constructor) {
    constructor.setAccessible(true);
    return constructor;
  }
}
